"""The variable-length FlashAttention-2 functions (flashattn.varlen) against the oracle, sequence by
sequence: out, lse and the gradients of q, k and v, on the CPU and on CUDA."""
import subprocess
import sys

import pytest
import torch

import flashattn
from conftest import requires_cuda
from flashattn.testing import GRAD_FACTOR, OUT_FACTOR, assert_oracle, reference_and_baseline

DEVICES = [pytest.param("cpu", id="cpu"), pytest.param("cuda", id="cuda", marks=requires_cuda)]

# (query lengths, key lengths) per sequence: different lengths, Lq != Lk both ways, an empty query
# sequence, one longer than a kernel tile, a single row.
LENGTHS = [
    pytest.param([5, 17, 1], [5, 17, 1], id="self"),
    pytest.param([3, 0, 40, 130], [7, 9, 33, 129], id="cross-empty-q"),
    pytest.param([70, 2], [1, 65], id="lq-gt-lk"),
]


def _cu(lengths, device):
    return torch.tensor([0] + list(torch.tensor(lengths).cumsum(0).tolist()), dtype=torch.int32, device=device)


def _packed(lengths, heads, head_dim, dtype, device):
    return torch.randn(sum(lengths), heads, head_dim, dtype=dtype, device=device)


def _oracle(q, k, v, dout, lengths_q, lengths_k, scale, causal):
    """Per sequence: (ref_out, ref_grads, ref_lse) and (base_out, base_grads), packed like the inputs."""
    refs, bases, lses = [], [], []
    starts_q, starts_k = _cu(lengths_q, "cpu").tolist(), _cu(lengths_k, "cpu").tolist()
    for b in range(len(lengths_q)):
        rows_q, rows_k = slice(starts_q[b], starts_q[b + 1]), slice(starts_k[b], starts_k[b + 1])
        (ref_out, ref_grads, ref_lse), (base_out, base_grads) = reference_and_baseline(
            q[rows_q][None], k[rows_k][None], v[rows_k][None], dout[rows_q][None], scale, causal, True)
        if ref_grads is None:  # no query rows: no output, no gradients
            ref_grads = [torch.zeros_like(t[None], dtype=ref_out.dtype) for t in (q[rows_q], k[rows_k], v[rows_k])]
            base_grads = [torch.zeros_like(t[None]) for t in (q[rows_q], k[rows_k], v[rows_k])]
        refs.append((ref_out[0], [g[0] for g in ref_grads]))
        bases.append((base_out[0], [g[0] for g in base_grads]))
        lses.append(ref_lse[0])
    cat = lambda parts: torch.cat(parts, 0)  # noqa: E731
    ref = (cat([r[0] for r in refs]), [cat([r[1][i] for r in refs]) for i in range(3)], torch.cat(lses, 1))
    base = (cat([r[0] for r in bases]), [cat([r[1][i] for r in bases]) for i in range(3)])
    return ref, base


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("lengths_q,lengths_k", LENGTHS)
@pytest.mark.parametrize("heads_q,heads_kv,head_dim", [(4, 4, 64), (6, 2, 128)])
def test_varlen_matches_oracle(device, causal, lengths_q, lengths_k, heads_q, heads_kv, head_dim):
    dtype = torch.bfloat16
    q = _packed(lengths_q, heads_q, head_dim, dtype, device)
    k = _packed(lengths_k, heads_kv, head_dim, dtype, device)
    v = _packed(lengths_k, heads_kv, head_dim, dtype, device)
    dout = torch.randn_like(q)
    scale = head_dim ** -0.5
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out, lse, keep = flashattn.flash_attn_varlen_func(
        *leaves, _cu(lengths_q, device), _cu(lengths_k, device), max(lengths_q) + 3, max(lengths_k), causal=causal,
        return_attn_probs=True)
    grads = torch.autograd.grad(out, leaves, dout)
    (ref_out, ref_grads, ref_lse), (base_out, base_grads) = _oracle(q, k, v, dout, lengths_q, lengths_k, scale, causal)
    assert out.shape == q.shape and out.dtype == dtype and keep is None
    assert lse.shape == (heads_q, sum(lengths_q)) and lse.dtype == torch.float32
    assert_oracle("out", out, ref_out, base_out, OUT_FACTOR)
    for name, grad, ref, base in zip(("dq", "dk", "dv"), grads, ref_grads, base_grads):
        assert_oracle(name, grad, ref, base, GRAD_FACTOR)
    empty = torch.isneginf(ref_lse)
    assert torch.equal(torch.isneginf(lse), empty.to(lse.device))
    torch.testing.assert_close(lse[~empty.to(lse.device)], ref_lse[~empty].to(lse.device), rtol=0, atol=2e-3)


@pytest.mark.parametrize("device", DEVICES)
def test_varlen_packed_variants_match_the_unpacked_one(device):
    lengths = [9, 30, 4]
    cu = _cu(lengths, device)
    qkv = torch.randn(sum(lengths), 3, 4, 64, dtype=torch.bfloat16, device=device)
    q, k, v = qkv.unbind(1)
    want = flashattn.flash_attn_varlen_func(q, k, v, cu, cu, 30, 30, causal=True)
    got_qkv = flashattn.flash_attn_varlen_qkvpacked_func(qkv, cu, 30, causal=True)
    got_kv = flashattn.flash_attn_varlen_kvpacked_func(q, qkv[:, 1:], cu, cu, 30, 30, causal=True)
    assert torch.equal(got_qkv, want) and torch.equal(got_kv, want)


@pytest.mark.parametrize("device", DEVICES)
def test_varlen_dropout_keeps_the_mask_it_returns(device):
    # With dropout the keep-mask comes back in the padded coordinates: the output rebuilt from it by
    # the reference, sequence by sequence, is the output.
    lengths = [12, 5]
    cu = _cu(lengths, device)
    q, k, v = (_packed(lengths, 2, 32, torch.float32 if device == "cpu" else torch.bfloat16, device) for _ in range(3))
    out, _, keep = flashattn.flash_attn_varlen_func(q, k, v, cu, cu, 12, 12, dropout_p=0.3, return_attn_probs=True)
    assert keep.shape == (2, 2, 12, 12) and keep.dtype == torch.bool
    starts = _cu(lengths, "cpu").tolist()
    for b, n in enumerate(lengths):
        rows = slice(starts[b], starts[b + 1])
        want = flashattn.attention_reference(q[rows][None].float(), k[rows][None].float(), v[rows][None].float(),
                                             32 ** -0.5, False, True, dropout_p=0.3,
                                             dropout_mask=keep[b:b + 1, :, :n, :n])
        torch.testing.assert_close(out[rows].float(), want[0], rtol=2e-2, atol=2e-2)


def test_varlen_argument_errors():
    q = torch.randn(10, 2, 16)
    cu = torch.tensor([0, 4, 10], dtype=torch.int32)
    with pytest.raises(ValueError, match="cu_seqlens_q must be int32"):
        flashattn.flash_attn_varlen_func(q, q, q, cu.long(), cu, 6, 6)
    with pytest.raises(ValueError, match="cu_seqlens_k must be a 1-dim"):
        flashattn.flash_attn_varlen_func(q, q, q, cu, cu[None], 6, 6)
    with pytest.raises(ValueError, match="same length"):
        flashattn.flash_attn_varlen_func(q, q, q, cu, cu[:2], 6, 6)
    with pytest.raises(ValueError, match="max_seqlen_k must be an int"):
        flashattn.flash_attn_varlen_func(q, q, q, cu, cu, 6, -1)
    with pytest.raises(ValueError, match="q must have 3 dims"):
        flashattn.flash_attn_varlen_func(q[None], q, q, cu, cu, 6, 6)
    with pytest.raises(ValueError, match="with block_table"):  # a paged cache is (num_pages, page_size, heads, dim)
        flashattn.flash_attn_varlen_func(q, q, q, cu, cu, 6, 6, block_table=cu)
    # The offsets themselves are checked on the device (here, the CPU raises at once).
    with pytest.raises(RuntimeError, match="longer than max_seqlen_q"):
        flashattn.flash_attn_varlen_func(q, q, q, cu, cu, 5, 6)
    with pytest.raises(RuntimeError, match="must be the packed row count"):
        flashattn.flash_attn_varlen_func(q, q, q, torch.tensor([0, 4, 9], dtype=torch.int32), cu, 6, 6)


def test_varlen_compiles_without_graph_breaks():
    lengths = [5, 17, 3]
    cu = _cu(lengths, "cpu")
    q, k, v = (_packed(lengths, 4, 32, torch.float32, "cpu").requires_grad_() for _ in range(3))
    compiled = torch.compile(lambda q, k, v: flashattn.flash_attn_varlen_func(q, k, v, cu, cu, 17, 17, causal=True),
                             fullgraph=True)
    out = compiled(q, k, v)
    torch.testing.assert_close(out, flashattn.flash_attn_varlen_func(q, k, v, cu, cu, 17, 17, causal=True))
    grads = torch.autograd.grad(out.sum(), (q, k, v))
    assert all(g.shape == t.shape for g, t in zip(grads, (q, k, v)))


def test_varlen_compiles_once_for_new_lengths():
    # New offsets and max_seqlen for every batch, forward and backward traced (aot_eager): at most one
    # recompile (the first new int becomes a symbolic one, also through the autograd kernel), not one
    # graph per batch of lengths.
    compiles = []
    aot_eager = torch._dynamo.lookup_backend("aot_eager")

    def backend(gm, example_inputs):
        compiles.append(gm)
        return aot_eager(gm, example_inputs)

    torch._dynamo.reset()
    compiled = torch.compile(lambda q, cu, m: flashattn.flash_attn_varlen_func(q, q, q, cu, cu, m, m, causal=True),
                             backend=backend, fullgraph=True)
    for lengths in ([5, 17, 3], [9, 4, 13], [2, 2, 20], [1, 6, 7]):
        cu = _cu(lengths, "cpu")
        q = _packed(lengths, 2, 16, torch.float32, "cpu").requires_grad_()
        out = compiled(q, cu, max(lengths))
        (grad,) = torch.autograd.grad(out.sum(), q)
        want = flashattn.flash_attn_varlen_func(q, q, q, cu, cu, max(lengths), max(lengths), causal=True)
        torch.testing.assert_close(out, want)
        torch.testing.assert_close(grad, torch.autograd.grad(want.sum(), q)[0])
    assert len(compiles) <= 2


def test_varlen_op_checks_offsets_on_cpu():
    # The op itself checks the offsets' values where it reads them (CPU here; on CUDA the list build).
    q = torch.randn(10, 2, 16)
    cu = torch.tensor([0, 4, 10], dtype=torch.int32)
    op = flashattn.ops.varlen_fwd
    with pytest.raises(RuntimeError, match=r"cu_seqlens_k\[0\] must be 0"):
        op(q, q, q, cu, torch.tensor([1, 4, 10], dtype=torch.int32), None, None, 0.25, False, True)
    with pytest.raises(RuntimeError, match="cu_seqlens_q must not decrease"):
        op(q, q, q, torch.tensor([0, 11, 10], dtype=torch.int32), cu, None, None, 0.25, False, True)
    with pytest.raises(RuntimeError, match=r"cu_seqlens_q\[-1\] must be the packed row count 10"):
        op(q, q, q, torch.tensor([0, 4, 9], dtype=torch.int32), cu, None, None, 0.25, False, True)
    with pytest.raises(RuntimeError, match="longer than max_seqlen_k=5"):
        op(q, q, q, cu, cu, None, None, 0.25, False, True, False, 6, 5)
    with pytest.raises(RuntimeError, match="seqused_q must be in"):
        op(q, q, q, cu, cu, torch.tensor([4, 7], dtype=torch.int32), None, 0.25, False, True)
    out, _ = op(q, q, q, cu, cu, None, None, 0.25, False, True, False, 6, 6)  # max_seqlen exactly the longest
    assert out.shape == q.shape


def _in_kernels_on(device):
    """Whether flash_attn_varlen_func runs the variable-length kernels on `device` at head dim 64 (the
    CPU always; CUDA on sm_90 with the sm90 kernels built)."""
    q = torch.empty(1, 1, 64, dtype=torch.bfloat16, device=device)
    return flashattn.varlen._in_kernels(q, q, q, 0.0, None)


def _no_padding(monkeypatch):
    """Makes the padded path fail, so that a test shows which path ran."""
    def fail(*args, **kwargs):
        raise AssertionError("the padded path ran")
    monkeypatch.setattr(flashattn.varlen, "_gather_padded", fail)


def _random_lengths(count, low, high, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(low, high + 1, (count,), generator=g).tolist()


# Many sequences of every size around the kernels' tiles (64-128 rows), so that the schedule's lists
# hold items of many costs and each CTA runs several; GQA, both dtypes, head dims of each tile width.
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("heads_q,heads_kv,head_dim", [(8, 2, 40), (4, 4, 96), (4, 1, 128), (4, 2, 160), (2, 2, 256)])
def test_varlen_kernels_many_sequences(device, causal, dtype, heads_q, heads_kv, head_dim, monkeypatch):
    if device == "cpu" and head_dim != 40:
        pytest.skip("the CPU runs one head dim here (it is slow)")
    if not _in_kernels_on(device):
        pytest.skip("no variable-length kernels on this device")
    _no_padding(monkeypatch)
    lengths_q = _random_lengths(23, 0, 300, seed=head_dim)
    lengths_k = [n if causal else n + (b % 3) * 17 for b, n in enumerate(lengths_q)]  # Lq != Lk without causal
    lengths_k[3] = 0  # a sequence without keys: out 0, lse -inf
    q = _packed(lengths_q, heads_q, head_dim, dtype, device)
    k = _packed(lengths_k, heads_kv, head_dim, dtype, device)
    v = _packed(lengths_k, heads_kv, head_dim, dtype, device)
    dout = torch.randn_like(q)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out, lse, _ = flashattn.flash_attn_varlen_func(*leaves, _cu(lengths_q, device), _cu(lengths_k, device),
                                                   max(lengths_q), max(lengths_k), causal=causal,
                                                   return_attn_probs=True)
    grads = torch.autograd.grad(out, leaves, dout)
    (ref_out, ref_grads, ref_lse), (base_out, base_grads) = _oracle(q, k, v, dout, lengths_q, lengths_k,
                                                                    head_dim ** -0.5, causal)
    assert_oracle("out", out, ref_out, base_out, OUT_FACTOR)
    for name, grad, ref, base in zip(("dq", "dk", "dv"), grads, ref_grads, base_grads):
        assert_oracle(name, grad, ref, base, GRAD_FACTOR)
    empty = torch.isneginf(ref_lse).to(lse.device)
    assert torch.equal(torch.isneginf(lse), empty)
    torch.testing.assert_close(lse[~empty], ref_lse.to(lse.device)[~empty], rtol=0, atol=2e-3)


@pytest.mark.parametrize("device", DEVICES)
def test_varlen_kernels_seqused(device, monkeypatch):
    # seqused_q / seqused_k: each sequence as if only its first rows existed; the other rows get out 0,
    # lse -inf and zero gradients.
    if not _in_kernels_on(device):
        pytest.skip("no variable-length kernels on this device")
    _no_padding(monkeypatch)
    lengths = [70, 0, 200, 9]
    used_q, used_k = [64, 0, 131, 9], [70, 0, 3, 1]
    q, k, v = (_packed(lengths, 2, 64, torch.bfloat16, device) for _ in range(3))
    dout = torch.randn_like(q)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    cu = _cu(lengths, device)
    as_int = lambda xs: torch.tensor(xs, dtype=torch.int32, device=device)  # noqa: E731
    out, lse, _ = flashattn.flash_attn_varlen_func(*leaves, cu, cu, 200, 200, causal=True, return_attn_probs=True,
                                                   seqused_q=as_int(used_q), seqused_k=as_int(used_k))
    grads = torch.autograd.grad(out, leaves, dout)
    starts = _cu(lengths, "cpu").tolist()
    pick = lambda t, used: torch.cat([t[s:s + u] for s, u in zip(starts, used)])  # noqa: E731
    (ref_out, ref_grads, ref_lse), (base_out, base_grads) = _oracle(
        pick(q, used_q), pick(k, used_k), pick(v, used_k), pick(dout, used_q), used_q, used_k, 64 ** -0.5, True)
    assert_oracle("out", pick(out, used_q), ref_out, base_out, OUT_FACTOR)
    for name, grad, used, ref, base in zip(("dq", "dk", "dv"), grads, (used_q, used_k, used_k), ref_grads, base_grads):
        assert_oracle(name, pick(grad, used), ref, base, GRAD_FACTOR)
    rest_q = torch.ones(q.size(0), dtype=torch.bool)
    rest_k = torch.ones(k.size(0), dtype=torch.bool)
    for s, uq, uk in zip(starts, used_q, used_k):
        rest_q[s:s + uq] = False
        rest_k[s:s + uk] = False
    assert torch.all(out[rest_q.to(device)] == 0) and torch.all(torch.isneginf(lse[:, rest_q.to(device)]))
    assert torch.all(grads[0][rest_q.to(device)] == 0)
    assert torch.all(grads[1][rest_k.to(device)] == 0) and torch.all(grads[2][rest_k.to(device)] == 0)


@requires_cuda
@pytest.mark.parametrize("head_dim", [64, 128, 192])
def test_varlen_kernels_deterministic(head_dim, monkeypatch):
    # deterministic=True: the same gradients bit for bit on every run (the dq turns over the list's
    # in-order items), and equal to the default mode's within rounding.
    if not _in_kernels_on("cuda"):
        pytest.skip("no variable-length kernels on this GPU")
    _no_padding(monkeypatch)
    lengths = _random_lengths(17, 1, 700, seed=5)
    cu = _cu(lengths, "cuda")
    q, k, v = (_packed(lengths, 4, head_dim, torch.bfloat16, "cuda").requires_grad_() for _ in range(3))
    dout = torch.randn_like(q)

    def grads(deterministic):
        out = flashattn.flash_attn_varlen_func(q, k, v, cu, cu, max(lengths), max(lengths), causal=True,
                                               deterministic=deterministic)
        return torch.autograd.grad(out, (q, k, v), dout)

    first = grads(True)
    for _ in range(3):
        assert all(torch.equal(a, b) for a, b in zip(first, grads(True)))
    for a, b in zip(first, grads(False)):
        torch.testing.assert_close(a, b, rtol=2e-2, atol=2e-2)


_BAD_OFFSETS = {
    # name: (cu_seqlens_q over 10 rows, max_seqlen_q, the message the device prints)
    "last entry": ("[0, 4, 9]", 6, "cu_seqlens_q[-1] must be the packed row count"),
    "decreasing": ("[0, 7, 5, 10]", 10, "cu_seqlens_q must not decrease"),
    "max_seqlen": ("[0, 4, 10]", 5, "longer than max_seqlen_q"),
}


@requires_cuda
@pytest.mark.parametrize("case", sorted(_BAD_OFFSETS))
def test_varlen_bad_offsets_stop_on_the_device(case):
    # On CUDA the offsets are checked by the kernel that builds the schedule: a device-side assertion
    # naming the argument, before any attention kernel reads a row. It leaves the CUDA context unusable,
    # so each case runs in a process of its own.
    if not _in_kernels_on("cuda"):
        pytest.skip("no variable-length kernels on this GPU")
    cu_q, max_q, message = _BAD_OFFSETS[case]
    code = (
        "import torch, flashattn\n"
        "q = torch.randn(10, 2, 64, device='cuda', dtype=torch.bfloat16)\n"
        f"cu_q = torch.tensor({cu_q}, dtype=torch.int32, device='cuda')\n"
        "cu_k = torch.tensor([0] + [10] * (cu_q.numel() - 1), dtype=torch.int32, device='cuda')\n"
        f"flashattn.flash_attn_varlen_func(q, q, q, cu_q, cu_k, {max_q}, 10)\n"
        "torch.cuda.synchronize()\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode != 0, run.stdout + run.stderr
    assert message in run.stdout + run.stderr, run.stdout + run.stderr


@requires_cuda
def test_varlen_kernels_equal_the_batched_kernels():
    # Equal lengths: the packed call and the batched call over the same rows agree to rounding (they run
    # different kernels' schedules, not different arithmetic).
    if not _in_kernels_on("cuda"):
        pytest.skip("no variable-length kernels on this GPU")
    batch, seqlen = 3, 257
    q, k, v = (torch.randn(batch, seqlen, 4, 64, dtype=torch.bfloat16, device="cuda") for _ in range(3))
    cu = torch.arange(0, (batch + 1) * seqlen, seqlen, dtype=torch.int32, device="cuda")
    packed = flashattn.flash_attn_varlen_func(*(t.flatten(0, 1) for t in (q, k, v)), cu, cu, seqlen, seqlen, causal=True)
    batched = flashattn.flash_attn_func(q, k, v, causal=True)
    torch.testing.assert_close(packed.view_as(batched), batched, rtol=0, atol=1e-2)


@requires_cuda
def test_varlen_kernels_graph_capture_and_tensor_max_seqlen():
    # No host synchronisation: the call captures into a CUDA graph, and a replay with new offsets (same
    # shapes) computes the new batch; a 0-dim tensor max_seqlen is accepted as is.
    if not _in_kernels_on("cuda"):
        pytest.skip("no variable-length kernels on this GPU")
    total, heads, dim = 600, 4, 64
    q, k, v = (torch.randn(total, heads, dim, dtype=torch.bfloat16, device="cuda") for _ in range(3))
    cu = torch.tensor([0, 100, 350, 600], dtype=torch.int32, device="cuda")
    max_len = torch.tensor(400, device="cuda")
    call = lambda: flashattn.flash_attn_varlen_func(q, k, v, cu, cu, max_len, max_len, causal=True)  # noqa: E731
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        call()  # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = call()
    cu.copy_(torch.tensor([0, 400, 410, 600], dtype=torch.int32))
    graph.replay()
    torch.testing.assert_close(captured, call(), rtol=0, atol=0)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("paged", [False, True])
def test_varlen_out_argument(device, paged):
    """out= receives the output and is returned in its place, paged (the decode op on CUDA) or not; a wrong
    shape, dtype or a gradient to carry raise."""
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    torch.manual_seed(0)
    cu_q = torch.tensor([0, 1, 3], dtype=torch.int32, device=device)
    q = torch.randn(3, 4, 32, dtype=dtype, device=device)
    if paged:
        k, v = (torch.randn(6, 16, 2, 32, dtype=dtype, device=device) for _ in range(2))
        block_table = torch.tensor([[4, 1], [0, 5]], dtype=torch.int32, device=device)
        kwargs = dict(block_table=block_table, seqused_k=torch.tensor([20, 9], dtype=torch.int32, device=device))
        cu_k, max_k = None, 32
    else:
        k, v = (torch.randn(29, 2, 32, dtype=dtype, device=device) for _ in range(2))
        kwargs = {}
        cu_k, max_k = torch.tensor([0, 20, 29], dtype=torch.int32, device=device), 20
    want = flashattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 2, max_k, causal=True, **kwargs)
    buffer = torch.full((5, 4, 32), float("nan"), dtype=dtype, device=device)
    got = flashattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 2, max_k, causal=True, out=buffer[1:4], **kwargs)
    assert got.data_ptr() == buffer[1:4].data_ptr()
    torch.testing.assert_close(buffer[1:4], want, rtol=0, atol=0)
    assert buffer[0].isnan().all() and buffer[4].isnan().all()
    out, lse, _ = flashattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 2, max_k, causal=True, return_attn_probs=True,
                                                   out=torch.empty_like(q), **kwargs)
    torch.testing.assert_close(out, want, rtol=0, atol=0)
    with pytest.raises(ValueError, match="out must be a .* tensor of shape \\(3, 4, 32\\)"):
        flashattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 2, max_k, out=buffer, **kwargs)
    with pytest.raises(ValueError, match="out must be a"):
        flashattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 2, max_k, out=torch.empty_like(q, dtype=torch.float16),
                                         **kwargs)
    with pytest.raises(RuntimeError, match="out= does not support autograd"):
        flashattn.flash_attn_varlen_func(q.requires_grad_(), k, v, cu_q, cu_k, 2, max_k, out=torch.empty_like(q),
                                         **kwargs)
