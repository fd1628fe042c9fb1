"""flashattn as torch.nn.attention's flash-attention provider (flashattn.integrations.torch_flash_impl):
on the CPU the registration, the functions' schemas and return tuples against aten's, and their
numerics (called directly); on CUDA, F.scaled_dot_product_attention on the flash backend and
torch.nn.attention.varlen.varlen_attn with the provider active against torch's own kernels."""
import inspect
import re

import pytest
import torch
import torch.nn.attention as attn
import torch.nn.functional as F

from flashattn import ops
from flashattn import varlen as fa_varlen
from flashattn.integrations import torch_flash_impl as tfi
from flashattn.reference import attention_reference

from conftest import requires_cuda

pytestmark = pytest.mark.skipif(not tfi.is_supported(),
                                reason=f"torch {torch.__version__} has no flash-attention provider hook")


@pytest.fixture
def restore():
    yield
    attn.restore_flash_attention_impl(_raise_warn=False) if "_raise_warn" in inspect.signature(
        attn.restore_flash_attention_impl).parameters else attn.restore_flash_attention_impl()


def _rand(*shape, dtype=torch.float64, device="cpu", seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float64).to(device=device, dtype=dtype)


# ---- registration ----

def test_register_is_idempotent_and_does_not_activate(restore):
    tfi.register()
    tfi.register()
    assert attn.list_flash_attention_impls().count("flashattn") == 1
    assert attn.current_flash_attention_impl() != "flashattn"


def test_activate_and_restore_switch_current_impl(restore):
    tfi.activate()
    assert attn.current_flash_attention_impl() == "flashattn"
    tfi.activate()  # again: the hook restores first, so the kernels are not registered twice
    assert attn.current_flash_attention_impl() == "flashattn"
    attn.restore_flash_attention_impl()
    assert attn.current_flash_attention_impl() is None
    tfi.activate()
    assert attn.current_flash_attention_impl() == "flashattn"


def test_import_does_not_register():
    import subprocess
    import sys
    code = ("import torch.nn.attention as a, flashattn, flashattn.integrations.torch_flash_impl; "
            "print('flashattn' in a.list_flash_attention_impls(), a.current_flash_attention_impl())")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert res.stdout.split() == ["False", "None"]


def test_missing_hook_raises_naming_the_torch_version(monkeypatch):
    monkeypatch.delattr(attn, "register_flash_attention_impl")
    assert not tfi.is_supported()
    with pytest.raises(ImportError, match=re.escape(f"this torch is {torch.__version__}")):
        tfi.register()


def test_overrides_every_hooked_op_present():
    names = set(tfi.overridden_ops())
    expected = {"_scaled_dot_product_flash_attention", "_scaled_dot_product_flash_attention_backward",
                "_flash_attention_forward", "_flash_attention_backward"}
    if hasattr(torch.ops.aten, "_flash_attention_forward_no_dropout_inplace"):
        expected.add("_flash_attention_forward_no_dropout_inplace")
    assert names == expected


@pytest.mark.parametrize("name", sorted(tfi.overridden_ops()))
def test_signature_matches_aten_schema(name):
    # The function takes this torch's arguments, in order, with the same keyword-only ones; arguments
    # a newer torch added (torch 2.11 has fewer than 2.14) may follow, keyword-only with a default, so
    # that one function serves both schemas.
    schema = getattr(torch.ops.aten, name).default._schema
    params = list(inspect.signature(tfi.overridden_ops()[name]).parameters.values())
    n = len(schema.arguments)
    assert [p.name for p in params[:n]] == [a.name for a in schema.arguments]
    assert [p.kind == inspect.Parameter.KEYWORD_ONLY for p in params[:n]] == [a.kwarg_only for a in schema.arguments]
    assert all(p.kind == inspect.Parameter.KEYWORD_ONLY and p.default is None for p in params[n:])


# ---- the functions on the CPU against the reference and aten's meta kernels ----

@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("heads_kv", [4, 2])
def test_sdpa_forward_backward(causal, heads_kv):
    b, hq, l, d = 2, 4, 7, 16
    q, k, v = _rand(b, hq, l, d, seed=1), _rand(b, heads_kv, l, d, seed=2), _rand(b, heads_kv, l, d, seed=3)
    r = tfi.sdpa_flash_forward(q, k, v, 0.0, causal, False, scale=0.3)
    assert len(r) == 9
    out, lse, cq, ck, max_q, max_k = r[:6]
    assert cq is None and ck is None and (max_q, max_k) == (l, l)
    rep = hq // heads_kv
    # attention_reference takes (batch, seqlen, heads, D)
    qr, kr, vr = (x.transpose(1, 2).clone().requires_grad_()
                  for x in (q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)))
    ref, ref_lse = attention_reference(qr, kr, vr, scale=0.3, is_causal=causal, return_lse=True)
    torch.testing.assert_close(out, ref.detach().transpose(1, 2))
    torch.testing.assert_close(lse, ref_lse.detach().to(lse.dtype))
    go = _rand(b, hq, l, d, seed=4)
    dq_ref, dk_ref, dv_ref = (g.transpose(1, 2) for g in torch.autograd.grad(ref, (qr, kr, vr), go.transpose(1, 2)))
    dq, dk, dv = tfi.sdpa_flash_backward(go, q, k, v, out, lse, None, None, l, l, 0.0, causal, r[6], r[7], scale=0.3)
    fold = lambda g: g.view(b, heads_kv, rep, l, d).sum(2)  # noqa: E731
    torch.testing.assert_close(dq, dq_ref)
    torch.testing.assert_close(dk, fold(dk_ref))
    torch.testing.assert_close(dv, fold(dv_ref))


def test_return_tuples_match_aten_meta():
    q, k, v = (_rand(2, 3, 8, 16, dtype=torch.bfloat16, seed=s) for s in (1, 2, 3))
    ours = tfi.sdpa_flash_forward(q, k, v, 0.0, True)
    meta = torch.ops.aten._scaled_dot_product_flash_attention(q.to("meta"), k.to("meta"), v.to("meta"), 0.0, True)
    assert len(ours) == len(meta)
    for i, (a, m) in enumerate(zip(ours, meta)):
        if isinstance(m, torch.Tensor) and m.device.type == "meta" and i != 2 and i != 3:
            assert (tuple(a.shape), a.dtype) == (tuple(m.shape), m.dtype), i
    assert ours[0].stride() == q.transpose(1, 2).contiguous().transpose(1, 2).stride()
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
    ours = tfi.flash_attention_forward(qt, kt, vt, None, None, 8, 8, 0.0, False, False)
    meta = torch.ops.aten._flash_attention_forward(qt.to("meta"), kt.to("meta"), vt.to("meta"), None, None, 8, 8,
                                                   0.0, False, False)
    for i, (a, m) in enumerate(zip(ours, meta)):
        assert (tuple(a.shape), a.dtype) == (tuple(m.shape), m.dtype), i


def _packed(lens_q, lens_k, hq, hk, d, seed):
    q, k, v = _rand(sum(lens_q), hq, d, seed=seed), _rand(sum(lens_k), hk, d, seed=seed + 1), \
        _rand(sum(lens_k), hk, d, seed=seed + 2)
    cu = lambda lens: torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32)  # noqa: E731
    return q, k, v, cu(lens_q), cu(lens_k)


@pytest.mark.parametrize("padded", [False, True], ids=["varlen_ops", "padded_path"])
@pytest.mark.parametrize("causal", ["none", "is_causal", "window", "sliding"])
def test_varlen_forward_backward_per_sequence(padded, causal, monkeypatch):
    if padded:  # the path CUDA takes where the varlen kernels do not serve a call (sm80, dropout, D > 128)
        monkeypatch.setattr(fa_varlen, "_in_kernels", lambda *a: False)
    lens_q, lens_k, hq, hk, d = [3, 0, 6, 4], [5, 2, 6, 4], 4, 2, 8
    q, k, v, cu_q, cu_k = _packed(lens_q, lens_k, hq, hk, d, seed=10)
    # "window": (-1, 0), the causal mask as torch.nn.attention.varlen passes it; "sliding": a window of
    # 2 keys left and 1 right of each sequence's bottom-right diagonal.
    kw = {"window": {"window_size_left": -1, "window_size_right": 0},
          "sliding": {"window_size_left": 2, "window_size_right": 1}}.get(causal, {})
    is_causal = causal == "is_causal"
    out, lse, rng, unused, debug = tfi.flash_attention_forward(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), 0.0,
                                                               is_causal, False, scale=0.5, **kw)
    assert lse.shape == (hq, q.size(0)) and debug.numel() == 0 and rng.dtype == torch.uint64
    dout = _rand(*q.shape, seed=20)
    dq, dk, dv = tfi.flash_attention_backward(dout, q, k, v, out, lse, cu_q, cu_k, max(lens_q), max(lens_k), 0.0,
                                              is_causal, rng, unused, scale=0.5, **kw)
    rep = hq // hk
    for i in range(len(lens_q)):
        sq, sk = slice(cu_q[i], cu_q[i + 1]), slice(cu_k[i], cu_k[i + 1])
        qi = q[sq][None].clone().requires_grad_()
        ki = k[sk].repeat_interleave(rep, 1)[None].requires_grad_()
        vi = v[sk].repeat_interleave(rep, 1)[None].requires_grad_()
        band = None
        if causal == "sliding":
            offset = torch.arange(lens_k[i])[None, :] - torch.arange(lens_q[i])[:, None] - (lens_k[i] - lens_q[i])
            band = (offset >= -2) & (offset <= 1)
        ref, ref_lse = attention_reference(qi, ki, vi, scale=0.5, is_causal=causal in ("is_causal", "window"),
                                           causal_bottom_right=True, return_lse=True, attn_mask=band)
        torch.testing.assert_close(out[sq], ref[0].detach())
        if lens_q[i]:
            torch.testing.assert_close(lse[:, sq], ref_lse[0].detach().to(lse.dtype))
        g = torch.autograd.grad(ref, (qi, ki, vi), dout[sq][None])
        torch.testing.assert_close(dq[sq], g[0][0])
        torch.testing.assert_close(dk[sk], g[1][0].view(lens_k[i], hk, rep, d).sum(2))
        torch.testing.assert_close(dv[sk], g[2][0].view(lens_k[i], hk, rep, d).sum(2))


def test_no_dropout_inplace_writes_out():
    if "_flash_attention_forward_no_dropout_inplace" not in tfi.overridden_ops():
        pytest.skip("this torch has no _flash_attention_forward_no_dropout_inplace")
    q, k, v = (_rand(2, 5, 3, 8, seed=s) for s in (1, 2, 3))
    out = torch.full_like(q, float("nan"))
    lse = tfi.flash_attention_forward_no_dropout_inplace(out, q, k, v, None, None, 5, 5, 0.0, True, False)
    ref_out, ref_lse, *_ = tfi.flash_attention_forward(q, k, v, None, None, 5, 5, 0.0, True, False)
    torch.testing.assert_close(out, ref_out)
    torch.testing.assert_close(lse, ref_lse)


def test_dropout_round_trip_uses_returned_rng_state():
    p = 0.3
    q, k, v = (_rand(2, 6, 2, 8, seed=s) for s in (1, 2, 3))
    torch.manual_seed(5)
    out, lse, rng, _, _ = tfi.flash_attention_forward(q, k, v, None, None, 6, 6, p, False, False)
    assert rng.dtype == torch.uint64 and rng.shape == (2,)
    keep = ops.dropout_keep_mask(rng.view(torch.int64), 2, 2, 6, 6, p)
    assert not keep.all()
    qr, kr, vr = (x.clone().requires_grad_() for x in (q, k, v))
    ref = attention_reference(qr, kr, vr, dropout_p=p, dropout_mask=keep)
    torch.testing.assert_close(out, ref.detach())
    dout = _rand(*q.shape, seed=9)
    g = torch.autograd.grad(ref, (qr, kr, vr), dout)
    d = tfi.flash_attention_backward(dout, q, k, v, out, lse, None, None, 6, 6, p, False, rng, torch.zeros(()))
    for a, b in zip(d, g):
        torch.testing.assert_close(a, b)
    torch.manual_seed(5)
    again = tfi.flash_attention_forward(q, k, v, None, None, 6, 6, p, False, False)[2]
    assert torch.equal(again, rng)


@pytest.mark.parametrize("kwargs,match", [
    ({"return_debug_mask": True}, "return_debug_mask"),
    ({"alibi_slopes": torch.ones(2)}, "alibi_slopes"),
    ({"seqused_k": torch.ones(2, dtype=torch.int32)}, "seqused_k"),
    ({"block_table": torch.zeros(2, 1, dtype=torch.int32)}, "block_table"),
])
def test_unsupported_arguments_raise(kwargs, match):
    q = _rand(2, 4, 2, 8)
    debug = kwargs.pop("return_debug_mask", False)
    with pytest.raises(NotImplementedError, match=match):
        tfi.flash_attention_forward(q, q, q, None, None, 4, 4, 0.0, False, debug, **kwargs)


def test_bad_varlen_arguments_raise():
    q, k, v, cu_q, cu_k = _packed([2, 3], [2, 3], 2, 2, 8, seed=0)
    with pytest.raises(ValueError, match="cum_seq_q and cum_seq_k"):
        tfi.flash_attention_forward(q, k, v, cu_q, None, 3, 3, 0.0, False, False)
    with pytest.raises(NotImplementedError, match="dropout_p > 0 with cum_seq_q"):
        tfi.flash_attention_forward(q, k, v, cu_q, cu_k, 3, 3, 0.1, False, False)
    with pytest.raises(ValueError, match="dropout_p must be in"):
        tfi.flash_attention_forward(q[None], k[None], v[None], None, None, 5, 5, 1.5, False, False)
    with pytest.raises(ValueError, match="4-dim"):
        tfi.sdpa_flash_forward(q, k, v)


# ---- CUDA: through the dispatcher ----

def _ran_flashattn(fn):
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        result = fn()
    return result, any(e.name.startswith("flashattn::") for e in prof.events())


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("heads_kv", [8, 2])
def test_gpu_sdpa_flash_backend_matches_torch(dtype, causal, heads_kv, restore):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    q = _rand(2, 8, 256, 64, dtype=dtype, device="cuda", seed=1).requires_grad_()
    k = _rand(2, heads_kv, 256, 64, dtype=dtype, device="cuda", seed=2).requires_grad_()
    v = _rand(2, heads_kv, 256, 64, dtype=dtype, device="cuda", seed=3).requires_grad_()
    go = _rand(2, 8, 256, 64, dtype=dtype, device="cuda", seed=4)
    gqa = heads_kv != 8

    def run():
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            out = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)
        return (out,) + torch.autograd.grad(out, (q, k, v), go)

    try:
        before = run()
    except RuntimeError as e:
        pytest.skip(f"torch's flash backend does not take this call: {e}")
    tfi.activate()
    after, used = _ran_flashattn(run)
    assert used, "F.scaled_dot_product_attention did not reach flashattn's kernels"
    tol = dict(atol=2e-2, rtol=2e-2) if dtype == torch.bfloat16 else dict(atol=5e-3, rtol=5e-3)
    for a, b in zip(after, before):
        torch.testing.assert_close(a, b, **tol)
    attn.restore_flash_attention_impl()
    again, used = _ran_flashattn(run)
    assert not used


@requires_cuda
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_varlen_attn_matches_torch(causal, restore):
    from torch.nn.attention.varlen import varlen_attn
    lens = [37, 1, 128, 64]  # max_q <= 128: torch's varlen_attn then takes the flash ops, not cuDNN
    q, k, v, cu, _ = _packed(lens, lens, 4, 4, 64, seed=3)
    q, k, v = (x.to("cuda", torch.bfloat16).requires_grad_() for x in (q, k, v))
    cu = cu.cuda()
    go = torch.randn_like(q)
    params = inspect.signature(varlen_attn).parameters
    kw = {"is_causal": causal} if "is_causal" in params else ({"window_size": (-1, 0)} if causal else {})

    def run():
        out = varlen_attn(q, k, v, cu, cu, max(lens), max(lens), **kw)
        return (out,) + torch.autograd.grad(out, (q, k, v), go)

    before = run()
    tfi.activate()
    after, used = _ran_flashattn(run)
    assert used, "varlen_attn did not reach flashattn's kernels"
    for a, b in zip(after, before):
        torch.testing.assert_close(a, b, atol=2e-2, rtol=2e-2)


@requires_cuda
def test_gpu_sdpa_dropout_uses_flashattn_mask_in_both_passes(restore):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    tfi.activate()
    q, k, v = (_rand(1, 2, 128, 64, dtype=torch.float16, device="cuda", seed=s).requires_grad_() for s in (1, 2, 3))
    go = _rand(1, 2, 128, 64, dtype=torch.float16, device="cuda", seed=4)
    torch.manual_seed(0)
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        out = F.scaled_dot_product_attention(q, k, v, dropout_p=0.2)
    grads = torch.autograd.grad(out, (q, k, v), go)
    # The forward drew its (seed, offset) first thing from the same generator state: the same pair gives
    # flashattn's own op the same mask, forward and backward.
    torch.manual_seed(0)
    rng = ops.draw_rng_state(q.device)
    qt, kt, vt = (x.detach().transpose(1, 2).requires_grad_() for x in (q, k, v))
    ref, _ = ops.attention(qt, kt, vt, 1 / 8, False, True, False, None, 0.2, rng)
    ref_grads = torch.autograd.grad(ref, (qt, kt, vt), go.transpose(1, 2))
    torch.testing.assert_close(out, ref.transpose(1, 2), atol=0, rtol=0)
    for a, b in zip(grads, ref_grads):
        torch.testing.assert_close(a, b.transpose(1, 2), atol=1e-3, rtol=1e-3)
