"""Packed and padded batches under attn_implementation="fattn" (flashattn.integrations.packing and the
varlen paths of flashattn.integrations.transformers), on the CPU in float32.

The oracle is each document run on its own through transformers' "sdpa" model with the same weights:
logits and the gradients of the summed per-document next-token loss must match. A check in each
test shows the comparison can fail: attention over the packed row without document boundaries
gives other logits.
"""
import copy
import importlib.util
import inspect

import pytest
import torch

transformers = pytest.importorskip("transformers")

import flashattn.integrations.transformers as fa_hf  # noqa: E402  (registers "fattn")
from flashattn.integrations import packing  # noqa: E402

NAME = fa_hf.ATTN_IMPLEMENTATION
# transformers before masking_utils (4.51) builds the models' 4-dim masks itself: a padding mask reaches
# "fattn" as a 4-dim mask (the masked kernel, not the varlen one), and no mask function can be swapped.
needs_mask_functions = pytest.mark.skipif(
    importlib.util.find_spec("transformers.masking_utils") is None,
    reason="this transformers has no masking_utils (before 4.53): its models build 4-dim masks themselves")
LAYERS = 2
F32_TOL = dict(rtol=1e-4, atol=1e-5)
LENGTHS = (5, 9, 1, 4)


def _model_pair():
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=LAYERS,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
                                      max_position_embeddings=256, pad_token_id=0)
    torch.manual_seed(0)
    ref = transformers.AutoModelForCausalLM.from_config(copy.deepcopy(config), attn_implementation="sdpa")
    ours = transformers.AutoModelForCausalLM.from_config(copy.deepcopy(config), attn_implementation=NAME)
    ours.load_state_dict(ref.state_dict())
    return ref.eval(), ours.eval()


@pytest.fixture(autouse=True)
def _fresh_state():
    fa_hf.path_counts.clear()
    fa_hf._warned_reasons.clear()
    packing._position_cache.clear()
    yield
    fa_hf._warned_reasons.clear()


def _docs(lengths=LENGTHS):
    return [torch.randint(1, 128, (n,)) for n in lengths]


def _doc_loss(logits, ids):
    """Summed next-token loss of one document (logits (n, V), ids (n,))."""
    if ids.numel() < 2:
        return logits.sum() * 0
    return torch.nn.functional.cross_entropy(logits[:-1], ids[1:], reduction="sum")


def _separate(ref, docs):
    """Per-document sdpa runs: (logits of all docs concatenated (total, V), gradients)."""
    ref.zero_grad()
    logits = [ref(d[None]).logits[0] for d in docs]
    sum(_doc_loss(lg, d) for lg, d in zip(logits, docs)).backward()
    return torch.cat(logits).detach(), {n: p.grad.clone() for n, p in ref.named_parameters()}


def _packed_run(model, docs, **kwargs):
    model.zero_grad()
    ids = torch.cat(docs)[None]
    logits = model(ids, **kwargs).logits[0]
    pieces = logits.split([d.numel() for d in docs])
    sum(_doc_loss(lg, d) for lg, d in zip(pieces, docs)).backward()
    return logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def _position_ids(docs):
    return torch.cat([torch.arange(d.numel()) for d in docs])[None]


def _cu(docs):
    return torch.tensor([0] + [d.numel() for d in docs]).cumsum(0)


def _assert_same(got, expected):
    logits, grads = got
    ref_logits, ref_grads = expected
    torch.testing.assert_close(logits, ref_logits, **F32_TOL)
    for name in ref_grads:
        torch.testing.assert_close(grads[name], ref_grads[name], **F32_TOL, msg=lambda m, name=name: f"{name}: {m}")


# --------------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------------


def test_cu_seqlens_from_position_ids():
    pos = torch.tensor([[0, 1, 2, 0, 1, 0, 0, 1, 2, 3]])
    cu, longest = packing.cu_seqlens_from_position_ids(pos)
    assert cu.dtype == torch.int32 and cu.tolist() == [0, 3, 5, 6, 10] and longest == 4
    # A row that does not start at 0 (positions only going up by one) is one document.
    assert packing.cu_seqlens_from_position_ids(torch.arange(3, 9)[None]) is None
    # A jump that is not a restart at 0 starts a document too (transformers' rule for packed rows).
    cu, longest = packing.cu_seqlens_from_position_ids(torch.tensor([[4, 5, 9, 10, 11]]))
    assert cu.tolist() == [0, 2, 5] and longest == 3
    with pytest.raises(ValueError, match="one row"):
        packing.cu_seqlens_from_position_ids(torch.zeros(2, 4, dtype=torch.long))


def test_position_ids_are_read_once_per_tensor(monkeypatch):
    calls = []
    derive = packing._derive
    monkeypatch.setattr(packing, "_derive", lambda p: calls.append(1) or derive(p))
    pos = torch.tensor([[0, 1, 0, 1, 2]])
    first = packing.cu_seqlens_from_position_ids(pos)
    assert packing.cu_seqlens_from_position_ids(pos) is first
    assert len(calls) == 1
    pos[0, 2:] = torch.tensor([2, 3, 4])  # in place: the cached answer is dropped
    assert packing.cu_seqlens_from_position_ids(pos) is None
    assert len(calls) == 2


def test_unpad_and_pad_round_trip():
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)
    layout = packing.unpad(mask)
    assert layout.cu_seqlens.tolist() == [0, 3, 6, 11] and int(layout.max_seqlen) == 5
    x = torch.randn(3, 5, 2, 4)
    packed = packing.gather(x, layout)
    assert packed.shape == (11, 2, 4)
    back = packing.pad(packed, layout)
    torch.testing.assert_close(back, x * mask[:, :, None, None])


def test_cu_seqlens_checks_name_the_argument():
    with pytest.raises(ValueError, match="cu_seq_lens_q.*integer"):
        packing.check_cu_seqlens("cu_seq_lens_q", torch.tensor([0.0, 3.0]), torch.device("cpu"))
    with pytest.raises(ValueError, match="cu_seq_lens_k.*1-dim"):
        packing.check_cu_seqlens("cu_seq_lens_k", torch.zeros(2, 2, dtype=torch.int32), torch.device("cpu"))
    with pytest.raises(TypeError, match="cu_seq_lens_q"):
        packing.check_cu_seqlens("cu_seq_lens_q", [0, 3], torch.device("cpu"))
    assert packing.check_cu_seqlens("x", torch.tensor([0, 3]), torch.device("cpu")).dtype == torch.int32
    with pytest.raises(ValueError, match="max_length_q"):
        packing.check_max_length("max_length_q", -1)
    with pytest.raises(ValueError, match="max_length_k"):
        packing.check_max_length("max_length_k", torch.tensor([3]))
    assert packing.check_max_length("m", torch.tensor(3)).dim() == 0


# --------------------------------------------------------------------------------------------------
# Inside a Llama model
# --------------------------------------------------------------------------------------------------


def test_packed_rows_without_boundaries_attend_across_documents():
    """The sensitivity check of this file: the packed row without document boundaries (what 'fattn' did
    before it read position_ids) gives other logits than the documents run separately."""
    ref, ours = _model_pair()
    docs = _docs()
    expected, _ = _separate(ref, docs)
    with torch.no_grad():
        crossing = ours(torch.cat(docs)[None]).logits[0]
    assert dict(fa_hf.path_counts) == {fa_hf.CAUSAL_TOP_LEFT: LAYERS}
    assert not torch.allclose(crossing, expected, **F32_TOL)
    torch.testing.assert_close(crossing[:LENGTHS[0]], expected[:LENGTHS[0]], **F32_TOL)  # the first doc alone agrees


@pytest.mark.parametrize("use_cache", [False, True], ids=["no-cache", "cache"])
def test_packed_position_ids_match_separate_documents(monkeypatch, use_cache):
    """Without a cache transformers detects the packing and builds a packed mask function (which the
    "fattn" mask function turns into None); with one it does not look, and the attention function alone
    reads position_ids."""
    ref, ours = _model_pair()
    docs = _docs()
    expected = _separate(ref, docs)
    if importlib.util.find_spec("transformers.masking_utils") is not None:  # older models build their masks inline
        from transformers import masking_utils

        def no_dense_mask(*args, **kwargs):
            raise AssertionError("an S x S mask was built")

        monkeypatch.setattr(masking_utils, "sdpa_mask", no_dense_mask)
    calls = []
    derive = packing._derive
    monkeypatch.setattr(packing, "_derive", lambda p: calls.append(1) or derive(p))
    got = _packed_run(ours, docs, position_ids=_position_ids(docs), use_cache=use_cache)
    assert dict(fa_hf.path_counts) == {fa_hf.VARLEN_PACKED: LAYERS}
    assert len(calls) == 1  # one host read per forward, not one per layer
    _assert_same(got, expected)


def test_cu_seq_lens_kwargs_match_separate_documents():
    ref, ours = _model_pair()
    docs = _docs()
    expected = _separate(ref, docs)
    cu = _cu(docs)  # int64, as a collator may give it: converted to int32
    longest = max(LENGTHS)
    # max_length as an int for q, a 0-dim tensor for k; no position_ids (the model's default arange), so only
    # the keyword arguments tell the documents apart.
    got = _packed_run(ours, docs, cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=longest,
                      max_length_k=torch.tensor(longest))
    assert dict(fa_hf.path_counts) == {fa_hf.VARLEN_PACKED: LAYERS}
    _assert_same(got, expected)


@pytest.mark.skipif("return_flash_attn_kwargs" not in inspect.signature(transformers.DataCollatorWithFlattening).parameters,
                    reason="this transformers' DataCollatorWithFlattening has no return_flash_attn_kwargs")
def test_data_collator_with_flattening_batches():
    ref, ours = _model_pair()
    docs = _docs((7, 3, 6))
    collator = transformers.DataCollatorWithFlattening(return_flash_attn_kwargs=True, return_position_ids=True)
    batch = collator([{"input_ids": d.tolist()} for d in docs])
    assert "cu_seq_lens_q" in batch and "position_ids" in batch
    expected = _separate(ref, docs)
    kwargs = {k: v for k, v in batch.items() if k not in ("input_ids", "labels")}
    got = _packed_run(ours, docs, **kwargs)
    assert dict(fa_hf.path_counts) == {fa_hf.VARLEN_PACKED: LAYERS}
    _assert_same(got, expected)


@needs_mask_functions
@pytest.mark.parametrize("side", ["left", "right"])
def test_2d_padding_masks_match_separate_sequences(side):
    ref, ours = _model_pair()
    docs = _docs((9, 4, 6))
    width = 9
    ids = torch.zeros(len(docs), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, d in enumerate(docs):
        cols = slice(width - d.numel(), width) if side == "left" else slice(0, d.numel())
        ids[i, cols], mask[i, cols] = d, 1
    expected = _separate(ref, docs)
    ours.zero_grad()
    logits = ours(ids, attention_mask=mask).logits
    assert dict(fa_hf.path_counts) == {fa_hf.VARLEN_UNPADDED: LAYERS}
    real = logits[mask.bool()]  # (total, V), row after row
    pieces = real.split([d.numel() for d in docs])
    sum(_doc_loss(lg, d) for lg, d in zip(pieces, docs)).backward()
    grads = {n: p.grad.clone() for n, p in ours.named_parameters()}
    if side == "right":  # with right padding positions already agree; with left they are offset (rope)
        _assert_same((real.detach(), grads), expected)
    else:  # left padding shifts positions by the pad count, as in sdpa's own padded run: compare to that
        ref_logits = ref(ids, attention_mask=mask).logits
        torch.testing.assert_close(real, ref_logits[mask.bool()], **F32_TOL)


def test_attention_function_pads_with_zeros_and_rejects_bad_arguments():
    module = torch.nn.Module()
    module.is_causal = True
    q, k, v = torch.randn(2, 4, 6, 8), torch.randn(2, 2, 6, 8), torch.randn(2, 2, 6, 8)
    mask = torch.ones(2, 6, dtype=torch.bool)
    mask[1, :2] = False
    out, _ = fa_hf.flashattn_attention_forward(module, q, k, v, mask)
    assert out.shape == (2, 6, 4, 8) and bool((out[1, :2] == 0).all())
    expected = torch.nn.functional.scaled_dot_product_attention(q[1:, :, 2:], k[1:, :, 2:], v[1:, :, 2:],
                                                                is_causal=True, enable_gqa=True)
    torch.testing.assert_close(out[1, 2:], expected[0].transpose(0, 1), **F32_TOL)
    with pytest.raises(ValueError, match="batch must be 1"):
        fa_hf.flashattn_attention_forward(module, q, k, v, None, cu_seq_lens_q=torch.tensor([0, 6]),
                                          cu_seq_lens_k=torch.tensor([0, 6]), max_length_q=6, max_length_k=6)
    with pytest.raises(ValueError, match="missing max_length_k"):
        fa_hf.flashattn_attention_forward(module, q[:1], k[:1], v[:1], None, cu_seq_lens_q=torch.tensor([0, 6]),
                                          cu_seq_lens_k=torch.tensor([0, 6]), max_length_q=6)
    with pytest.raises(ValueError, match="2-dim padding mask"):
        fa_hf.flashattn_attention_forward(module, q, k, v, mask[:, :5])


@pytest.mark.parametrize("kind", ["position_ids", "padding"])
def test_a_fallback_keeps_the_documents_apart(monkeypatch, kind):
    """Where the kernels cannot serve a call (faked here), sdpa gets the equivalent dense mask."""
    ref, ours = _model_pair()
    monkeypatch.setattr(fa_hf, "fallback_reason", lambda *args: "a reason made up for the test")
    if kind == "position_ids":
        docs = _docs()
        expected, _ = _separate(ref, docs)
        with pytest.warns(UserWarning, match="made up"), torch.no_grad():
            got = ours(torch.cat(docs)[None], position_ids=_position_ids(docs)).logits[0]
        torch.testing.assert_close(got, expected, **F32_TOL)
    else:
        ids = torch.randint(1, 128, (2, 8))
        mask = torch.ones_like(ids)
        mask[0, :3] = 0
        with pytest.warns(UserWarning, match="made up"), torch.no_grad():
            got = ours(ids, attention_mask=mask).logits
            expected = ref(ids, attention_mask=mask).logits
        torch.testing.assert_close(got[mask.bool()], expected[mask.bool()], **F32_TOL)
    assert fa_hf.path_counts[fa_hf.FALLBACK] == LAYERS
