"""Reliability of the CUDA kernels at the edges: tensors past 2^31 elements, a 262144-token sequence in
O(N) memory, extreme values (bf16 scores of 1e4, fp16 values near overflow), rows that see no key, and
NaN inputs. Each test runs with the kernels the dispatch picks and again with the planner's force_sm80 option
(the ``kernel_path`` fixture: the sm90 and the sm80 kernels on Hopper).

Long inputs are checked against tests/chunked_reference.py (exact float32 math on sampled rows and keys,
streaming over the other side in chunks; nothing N x N), short ones against flashattn.reference in
float64 with the oracle of flashattn.testing where it applies. Tests marked ``large`` allocate up to
about 30 GiB and take up to about a minute each on an H200 (``-m "not large"`` leaves them out).
"""
import json
import os
import subprocess
import sys

import pytest
import torch

from flashattn.reference import attention_reference
from flashattn.testing import GRAD_FACTOR, OUT_FACTOR, assert_oracle, reference_and_baseline

from chunked_reference import reference_keys, reference_rows
from conftest import requires_cuda

pytestmark = requires_cuda

DEVICE = "cuda"
GIB = 1 << 30
MIB = 1 << 20
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(autouse=True)
def _exact_float32_matmuls():
    """The references' float32 matmuls must not run in TF32."""
    saved = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32 = saved


def _require_free_memory(gib):
    torch.cuda.empty_cache()
    free, _ = torch.cuda.mem_get_info()
    if free < gib * GIB:
        pytest.skip(f"needs {gib} GiB of free GPU memory, {free / GIB:.0f} GiB free")


def _randn(batch, seqlen, heads, head_dim, dtype, layout="contiguous", device=DEVICE):
    """[B, S, H, D] normal values, contiguous or a transposed [B, H, S, D] tensor ("bhsd"); drawn in
    chunks of 2^28 elements so any size works."""
    shape = (batch, seqlen, heads, head_dim) if layout == "contiguous" else (batch, heads, seqlen, head_dim)
    t = torch.empty(shape, dtype=dtype, device=device)
    for chunk in t.view(-1).split(1 << 28):
        chunk.normal_()
    return t if layout == "contiguous" else t.transpose(1, 2)


def _rows_past_2_31(t):
    """For each head of a [B, S, H, D] tensor, the rows just before and at element 2^31 of its storage."""
    rows = set()
    for h in range(t.shape[2]):
        first = -(-(2**31 - h * t.stride(2)) // t.stride(1))  # ceil
        rows.update(r for r in (first - 1, first) if 0 <= r < t.shape[1])
    return rows


def _sample(n, extra=(), count=24, seed=0):
    """Sorted indices in [0, n): both ends, tile edges, ``extra``, and ``count`` random ones."""
    gen = torch.Generator().manual_seed(seed)
    fixed = {0, 1, 63, 64, 127, 128, n // 2, n - 129, n - 128, n - 2, n - 1} | set(extra)
    chosen = {i for i in fixed if 0 <= i < n} | set(torch.randint(0, n, (count,), generator=gen).tolist())
    return torch.tensor(sorted(chosen))


def _check(name, got, ref, rel, abs_=0.0):
    """No NaN or inf, and max|got - ref| <= rel * max|ref| + abs_ (relative by default: with 8M keys the
    outputs and gradients are of order 1e-4 to 1e-6)."""
    got, ref = got.double(), ref.double()
    assert got.shape == ref.shape, f"{name}: shape {tuple(got.shape)} != {tuple(ref.shape)}"
    assert torch.isfinite(got).all(), f"{name}: NaN or inf"
    err = (got - ref).abs().max().item()
    bound = rel * ref.abs().max().item() + abs_
    assert err <= bound, f"{name}: max|result - reference| = {err:.3e} > {bound:.3e}"


def _check_lse(lse, ref, rtol=1e-4):
    """-inf exactly where the reference row sees no key, no NaN, close elsewhere (the GPU suite's rule)."""
    empty = torch.isneginf(ref)
    assert torch.equal(torch.isneginf(lse), empty), "lse: -inf rows differ from the reference"
    assert not torch.isnan(lse).any(), "lse has NaN"
    torch.testing.assert_close(lse[~empty].double(), ref[~empty].double(), atol=1e-3, rtol=rtol)


# --------------------------------------------------------------------------------------------------
# Large inputs
# --------------------------------------------------------------------------------------------------


def check_long_side(side, layout, backward, device=DEVICE, heads_q=8, heads_kv=2, head_dim=128, short=256,
                    long=None, key_chunk=1 << 16, query_chunk=1 << 16):
    """Forward (and backward) where the ``side`` ("q" or "kv") is ``long`` tokens and the other ``short``,
    so q, out, dout, dq ("q") or k, v, dk, dv ("kv") pass 2^31 elements (the default ``long``: 4096
    tokens more than 2^31 elements) while the work stays small. Top-left causal for a long q,
    bottom-right for long k/v (every query then sees nearly every key). Returns the long tensor's size."""
    dtype = torch.bfloat16
    if long is None:
        long = 2**31 // ((heads_q if side == "q" else heads_kv) * head_dim) + 4096
    seqlen_q, seqlen_k = (long, short) if side == "q" else (short, long)
    is_causal, bottom_right = True, side == "kv"
    q = _randn(1, seqlen_q, heads_q, head_dim, dtype, layout if side == "q" else "contiguous", device)
    k, v = (_randn(1, seqlen_k, heads_kv, head_dim, dtype, layout if side == "kv" else "contiguous", device)
            for _ in range(2))
    big = q if side == "q" else k
    scale = head_dim**-0.5

    out, lse = torch.ops.flashattn.fwd(q, k, v, scale, is_causal, bottom_right)
    assert torch.isfinite(out).all() and torch.isfinite(lse).all()
    rows = _sample(seqlen_q, _rows_past_2_31(q) | _rows_past_2_31(out) if side == "q" else ())
    dout = _randn(1, seqlen_q, heads_q, head_dim, dtype, device=device) if backward else None
    ref_out, ref_lse, ref_dq = reference_rows(q, k, v, dout, rows, scale, is_causal, bottom_right,
                                              key_chunk=key_chunk)
    _check("out", out[:, rows], ref_out, 1e-2)
    _check_lse(lse[:, :, rows], ref_lse)
    if not backward:
        return big.numel()

    dq, dk, dv = torch.ops.flashattn.bwd(dout, q, k, v, out, lse, scale, is_causal, bottom_right)
    for name, g in (("dq", dq), ("dk", dk), ("dv", dv)):
        assert torch.isfinite(g).all(), f"{name} has NaN or inf"
    _check("dq", dq[:, rows], ref_dq, 2e-2)
    keys = _sample(seqlen_k, _rows_past_2_31(k) | _rows_past_2_31(dk) if side == "kv" else ())
    ref_dk, ref_dv = reference_keys(q, k, v, dout, out, lse, keys, scale, is_causal, bottom_right,
                                    query_chunk=query_chunk)
    _check("dk", dk[:, keys], ref_dk, 2e-2)
    _check("dv", dv[:, keys], ref_dv, 2e-2)
    return big.numel()


@pytest.mark.large
@pytest.mark.parametrize("layout", ["contiguous", "bhsd"])
@pytest.mark.parametrize("side", ["q", "kv"])
def test_more_than_2_31_elements(side, layout, kernel_path):
    """q (or k and v) just past 2^31 elements, bf16 (q, out, dout, dq: 4 GiB each, the fp32 dq workspace
    8 GiB): every sampled row and key, including those at element 2^31 of their tensor (the last heads'
    rows in the transposed layout), matches the reference."""
    _require_free_memory(40)
    numel = check_long_side(side, layout, backward=True)
    assert numel > 2**31


def check_long_sequence(seqlen, backward, device=DEVICE, heads=2, head_dim=64):
    """One 262144-token causal sequence (B = 1): sampled rows and keys against the chunked reference."""
    dtype = torch.bfloat16
    q, k, v = (_randn(1, seqlen, heads, head_dim, dtype, device=device) for _ in range(3))
    scale = head_dim**-0.5
    out, lse = torch.ops.flashattn.fwd(q, k, v, scale, True, False)
    rows = _sample(seqlen)
    dout = _randn(1, seqlen, heads, head_dim, dtype, device=device) if backward else None
    ref_out, ref_lse, ref_dq = reference_rows(q, k, v, dout, rows, scale, True, False)
    _check("out", out[:, rows], ref_out, 1e-2)
    _check_lse(lse[:, :, rows], ref_lse)
    if backward:
        dq, dk, dv = torch.ops.flashattn.bwd(dout, q, k, v, out, lse, scale, True, False)
        _check("dq", dq[:, rows], ref_dq, 2e-2)
        keys = _sample(seqlen, seed=1)
        ref_dk, ref_dv = reference_keys(q, k, v, dout, out, lse, keys, scale, True, False)
        _check("dk", dk[:, keys], ref_dk, 2e-2)
        _check("dv", dv[:, keys], ref_dv, 2e-2)


@pytest.mark.large
def test_sequence_of_262144_tokens(kernel_path):
    check_long_sequence(262144, backward=True)


def _peak_extra(fn, *args):
    """(fn(*args), peak bytes allocated during the call beyond what was allocated before it)."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    result = fn(*args)
    torch.cuda.synchronize()
    return result, torch.cuda.max_memory_allocated() - before


@pytest.mark.large
def test_memory_is_linear_up_to_262144_tokens(kernel_path):
    """Forward: nothing beyond out and lse. Backward: grows 4x from N = 65536 to 262144 (an N x N score
    matrix would grow 16x; at N = 262144 one would take 256 GiB)."""
    heads, head_dim = 2, 64
    extras = {}
    for seqlen in (65536, 262144):
        q, k, v = (_randn(1, seqlen, heads, head_dim, torch.bfloat16) for _ in range(3))
        args = (q, k, v, 0.125, True, False)
        torch.ops.flashattn.fwd(*args)  # warm-up: lazy initialization stays out of the measurement
        (out, lse), fwd_extra = _peak_extra(torch.ops.flashattn.fwd, *args)
        out_lse = out.numel() * out.element_size() + lse.numel() * lse.element_size()
        assert fwd_extra <= out_lse + MIB, (
            f"N={seqlen}: forward allocated {fwd_extra / MIB:.1f} MiB; out + lse = {out_lse / MIB:.1f} MiB")
        dout = torch.randn_like(out)
        bwd_args = (dout, q, k, v, out, lse, 0.125, True, False)
        torch.ops.flashattn.bwd(*bwd_args)
        _, extras[seqlen] = _peak_extra(torch.ops.flashattn.bwd, *bwd_args)
        q_bytes = q.numel() * q.element_size()
        # dq, dk, dv (3 q's worth), the fp32 dq workspace (2), delta and lse workspaces (small).
        assert extras[seqlen] <= 8 * q_bytes, f"N={seqlen}: backward allocated {extras[seqlen] / MIB:.1f} MiB"
        del q, k, v, out, lse, dout, args, bwd_args
    ratio = extras[262144] / extras[65536]
    assert ratio <= 4.4, f"backward extra memory grew {ratio:.2f}x from N=65536 to N=262144 (linear: 4x)"


def check_seqlen_just_below_2_31():
    """Runs in a child process (a fault there cannot spoil this one): q of 2^31 - 64 tokens (H = 1,
    D = 1, fp16), past flashattn's limit of 2^31 - 1024 tokens: the forward must either compute it or
    refuse it with a size error naming the limit, never fail inside a kernel."""
    child = r"""
import json, sys, torch
import flashattn
n = 2**31 - 64
q = torch.empty(1, n, 1, 1, device="cuda", dtype=torch.float16)
for chunk in q.view(-1).split(1 << 28):
    chunk.normal_()
k, v = (torch.randn(1, 16, 1, 1, device="cuda", dtype=torch.float16) for _ in range(2))
try:
    out, lse = torch.ops.flashattn.fwd(q, k, v, 1.0, False, False)
    torch.cuda.synchronize()
except Exception as exc:
    print(json.dumps({"error": type(exc).__name__ + ": " + " ".join(str(exc).split())[:400]}))
    sys.exit(0)
rows = torch.tensor([0, 1, 127, 128, n // 2, n - 129, n - 128, n - 2, n - 1], device="cuda")
s = q[0, rows, 0, 0].double()[:, None] * k[0, :, 0, 0].double()[None, :]
ref = torch.softmax(s, -1) @ v[0, :, 0, 0].double()
print(json.dumps({"out_err": (out[0, rows, 0, 0].double() - ref).abs().max().item(),
                  "lse_err": (lse[0, 0, rows].double() - torch.logsumexp(s, -1)).abs().max().item(),
                  "finite": bool(torch.isfinite(out).all() and torch.isfinite(lse).all())}))
"""
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, cwd=REPO, env=env,
                          timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip(), f"child process failed:\n{proc.stdout}\n{proc.stderr[-3000:]}"
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    if "error" in result:
        assert "2^31" in result["error"], (
            f"seqlen_q = 2^31 - 64 passes the size check but the forward failed with {result['error']!r}; "
            "expected results or a size error")
    else:
        assert result["finite"] and result["out_err"] <= 2e-2 and result["lse_err"] <= 1e-3, result


@pytest.mark.large
def test_seqlen_just_below_2_31():
    _require_free_memory(24)
    check_seqlen_just_below_2_31()


# --------------------------------------------------------------------------------------------------
# Numerics: extreme values, rows that see no key, NaN
# --------------------------------------------------------------------------------------------------


def _oracle_check(q, k, v, dout, scale, is_causal, bottom_right):
    """Forward + backward against the oracle (float64 reference, baseline in the inputs' dtype)."""
    out, lse = torch.ops.flashattn.fwd(q, k, v, scale, is_causal, bottom_right)
    grads = torch.ops.flashattn.bwd(dout, q, k, v, out, lse, scale, is_causal, bottom_right)
    (ref_out, ref_grads, ref_lse), (base_out, base_grads) = reference_and_baseline(
        q, k, v, dout, scale, is_causal, bottom_right, ref_dtype=torch.float64)
    assert_oracle("out", out, ref_out, base_out, OUT_FACTOR)
    for name, g, r, b in zip(("dq", "dk", "dv"), grads, ref_grads, base_grads):
        assert_oracle(name, g, r, b, GRAD_FACTOR)
    return out, lse, grads, ref_lse


def check_bf16_scores_of_1e4(device=DEVICE):
    """bf16 q and k of magnitude ~48 (scores up to ~1e4 in magnitude, both signs, plus planted pairs at
    +-12800): out and the gradients pass the oracle, lse is exact to float32 rounding of 1e4."""
    gen = torch.Generator().manual_seed(1)
    batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim = 1, 257, 300, 4, 2, 64
    q = (torch.randn(batch, seqlen_q, heads_q, head_dim, generator=gen) * 48).to(torch.bfloat16)
    k = (torch.randn(batch, seqlen_k, heads_kv, head_dim, generator=gen) * 48).to(torch.bfloat16)
    v = torch.randn(batch, seqlen_k, heads_kv, head_dim, generator=gen).to(torch.bfloat16)
    dout = torch.randn(batch, seqlen_q, heads_q, head_dim, generator=gen).to(torch.bfloat16)
    k[0, 7, 0] = 40.0
    q[0, 200, 0] = 40.0  # score +12800 with key 7 (query head 0 reads key/value head 0)
    q[0, 201, 1] = -40.0  # score -12800 with key 7 (query head 1 reads it too)
    q, k, v, dout = (t.to(device) for t in (q, k, v, dout))
    scale = head_dim**-0.5
    scores = torch.einsum("bqhd,bkhd->bhqk", q.double(), k.double().repeat_interleave(2, dim=2)) * scale
    assert scores.abs().max().item() >= 1e4 and scores.min().item() <= -1e4
    _, lse, _, ref_lse = _oracle_check(q, k, v, dout, scale, False, False)
    _check_lse(lse, ref_lse, rtol=1e-5)


def test_bf16_scores_of_1e4(kernel_path):
    check_bf16_scores_of_1e4()


def check_fp16_near_overflow(device=DEVICE):
    """fp16 q, k entries of 200-300 (their dot products, up to 5.8e6, overflow fp16: the kernels must sum
    them in fp32) with scale 1e-3 (scores in the thousands), v entries of 5e4-6e4 (outputs near fp16's
    65504). The fp16 baseline of the oracle overflows itself, so the float64 reference is used with
    fp16 rounding bounds; dout is small enough that the exact gradients fit in fp16."""
    gen = torch.Generator().manual_seed(2)
    batch, seqlen_q, seqlen_k, heads, head_dim = 1, 200, 300, 2, 64

    def signed(shape, low, high):
        sign = torch.randint(0, 2, shape, generator=gen) * 2 - 1
        return (sign * (low + (high - low) * torch.rand(shape, generator=gen))).to(torch.float16).to(device)

    q = signed((batch, seqlen_q, heads, head_dim), 200, 300)
    k = signed((batch, seqlen_k, heads, head_dim), 200, 300)
    v = signed((batch, seqlen_k, heads, head_dim), 5e4, 6e4)
    dout = (torch.randn(batch, seqlen_q, heads, head_dim, generator=gen) * 1e-2).to(torch.float16).to(device)
    scale, is_causal, bottom_right = 1e-3, True, True
    dots = torch.einsum("bqhd,bkhd->bhqk", q.double(), k.double())
    assert dots.abs().max().item() > 65504  # what a fp16 accumulation would overflow on

    out, lse = torch.ops.flashattn.fwd(q, k, v, scale, is_causal, bottom_right)
    dq, dk, dv = torch.ops.flashattn.bwd(dout, q, k, v, out, lse, scale, is_causal, bottom_right)
    leaves = [t.double().requires_grad_() for t in (q, k, v)]
    ref_out, ref_lse = attention_reference(*leaves, scale, is_causal, bottom_right, return_lse=True)
    ref_dq, ref_dk, ref_dv = torch.autograd.grad(ref_out, leaves, dout.double())
    eps = torch.finfo(torch.float16).eps
    assert torch.isfinite(out).all(), "out has NaN or inf"
    _check("out", out, ref_out.detach(), 0.0, abs_=4 * eps * v.double().abs().max().item())
    _check_lse(lse, ref_lse.detach(), rtol=1e-5)
    _check("dq", dq, ref_dq, 2e-2, abs_=1e-2)
    _check("dk", dk, ref_dk, 2e-2, abs_=1e-2)
    _check("dv", dv, ref_dv, 2e-2, abs_=1e-4)


def test_fp16_near_overflow(kernel_path):
    check_fp16_near_overflow()


def check_rows_that_see_no_key(head_dim, device=DEVICE):
    """Bottom-right causal with Lq = 300 > Lk = 100: the first 200 query rows see no key, so their out
    rows and dq rows are exactly 0 and their lse -inf; every other row passes the oracle."""
    gen = torch.Generator().manual_seed(3)
    shape_q, shape_kv = (2, 300, 4, head_dim), (2, 100, 2, head_dim)
    q, k, v = (torch.randn(s, generator=gen).to(torch.bfloat16).to(device) for s in (shape_q, shape_kv, shape_kv))
    dout = torch.randn(shape_q, generator=gen).to(torch.bfloat16).to(device)
    out, lse, (dq, _, _), ref_lse = _oracle_check(q, k, v, dout, head_dim**-0.5, True, True)
    assert torch.equal(out[:, :200], torch.zeros_like(out[:, :200]))
    assert torch.isneginf(lse[:, :, :200]).all() and torch.isfinite(lse[:, :, 200:]).all()
    assert torch.equal(dq[:, :200], torch.zeros_like(dq[:, :200]))
    _check_lse(lse, ref_lse)


@pytest.mark.parametrize("head_dim", [64, 96])
def test_rows_that_see_no_key(head_dim, kernel_path):
    check_rows_that_see_no_key(head_dim)


def check_nan_propagates(which, backward, device=DEVICE):
    """One NaN in q, k or v. The outputs that depend on it are NaN (not hidden as 0 or -inf); every other
    output row is bitwise what it is without the NaN (the forward is reproducible and rows are
    independent). Causal (top-left) for q and k, so rows that cannot see the NaN key stay clean."""
    gen = torch.Generator().manual_seed(4)
    shape_q, shape_kv = (1, 200, 4, 64), (1, 200, 2, 64)
    q, k, v = (torch.randn(s, generator=gen).to(torch.float16).to(device) for s in (shape_q, shape_kv, shape_kv))
    dout = torch.randn(shape_q, generator=gen).to(torch.float16).to(device)
    is_causal, scale = which != "v", 0.125
    clean_out, clean_lse = torch.ops.flashattn.fwd(q, k, v, scale, is_causal, False)
    nan_out = torch.zeros(clean_out.shape, dtype=torch.bool, device=device)  # where out must be NaN
    nan_lse = torch.zeros(clean_lse.shape, dtype=torch.bool, device=device)
    if which == "q":
        q[0, 150, 1, 3] = float("nan")  # query row 150 of head 1
        nan_out[0, 150, 1, :] = True
        nan_lse[0, 1, 150] = True
    elif which == "k":
        k[0, 70, 1, 5] = float("nan")  # key 70 of key/value head 1 (query heads 2 and 3)
        nan_out[0, 70:, 2:4, :] = True  # the rows that see key 70
        nan_lse[0, 2:4, 70:] = True
    else:
        v[0, 70, 1, 5] = float("nan")  # column 5 of value 70 (every row of heads 2 and 3 sees it)
        nan_out[0, :, 2:4, 5] = True
    out, lse = torch.ops.flashattn.fwd(q, k, v, scale, is_causal, False)
    assert torch.isnan(out[nan_out]).all(), "an output that depends on the NaN is not NaN"
    assert torch.equal(out[~nan_out], clean_out[~nan_out]), "outputs that do not depend on the NaN changed"
    assert torch.equal(lse[~nan_lse], clean_lse[~nan_lse]), "lse of rows that do not depend on the NaN changed"
    if backward:
        dq, dk, dv = torch.ops.flashattn.bwd(dout, q, k, v, out, lse, scale, is_causal, False)
        if which == "q":  # row 150 of head 1 sees keys 0..150 of key/value head 0
            nan_dq, nan_dkv = dq[0, 150, 1], (dk[0, :151, 0], dv[0, :151, 0])
            clean = (dq[0, :, 2:], dk[0, :, 1], dv[0, :, 1])
        elif which == "k":
            nan_dq, nan_dkv = dq[0, 70:, 2:4], (dk[0, 70, 1], dv[0, 70, 1])
            clean = (dq[0, :, :2], dk[0, :, 0], dv[0, :, 0])
        else:  # delta = rowsum(dout * out) is NaN on every row of heads 2 and 3; dv does not read v
            nan_dq, nan_dkv = dq[0, :, 2:4], (dk[0, :, 1],)
            clean = (dq[0, :, :2], dk[0, :, 0], dv[0])
        assert torch.isnan(nan_dq).all(), "dq of a row that depends on the NaN is not NaN"
        assert all(torch.isnan(g).all() for g in nan_dkv), "dk/dv of a key that depends on the NaN is not NaN"
        assert all(torch.isfinite(g).all() for g in clean), "a gradient independent of the NaN is not finite"
    # Last, so the checks above run either way: a row with a NaN score must not report "no key" (-inf).
    assert torch.isnan(lse[nan_lse]).all(), (
        f"lse of the rows that depend on the NaN: {lse[nan_lse].unique().tolist()[:4]}, expected NaN")


@pytest.mark.parametrize("which", ["q", "k", "v"])
def test_nan_propagates(which, kernel_path):
    check_nan_propagates(which, backward=True)
