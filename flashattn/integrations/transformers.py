"""flashattn as an attention implementation for HuggingFace transformers.

Importing this module registers flashattn's attention function with transformers' ``AttentionInterface``
(and, where the installed transformers has one, the matching mask function with ``AttentionMaskInterface``)
under the name ``"fattn"``::

    import flashattn.integrations.transformers  # registers "fattn"
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(name, attn_implementation="fattn", dtype=torch.bfloat16).cuda()

Why not ``"flashattn"``: recent transformers (5.x) treat every ``attn_implementation`` whose name contains
"flash" as a FlashAttention kernel to load (from the flash_attn packages or the Hub) and fail on any
other. :func:`register` takes another name where the installed version allows it.

What runs where. The model's attention module hands over query ``(B, Hq, S, D)`` and key/value
``(B, Hkv, S_kv, D)``; flashattn's kernels read them in place as ``(B, S, H, D)`` views and return
``(B, S, Hq, D)``, the layout transformers expects:

* grouped-query attention (``module.num_key_value_groups`` > 1) runs natively, without repeating k/v;
* the scale is the ``scaling`` argument (``1 / sqrt(D)`` when absent);
* no mask (transformers leaves it out when causal masking alone is right): causal for ``q_len > 1``
  with torch's top-left alignment, as transformers' SDPA path does (``q_len == k_len`` in training and
  prefill, an empty static cache's unused slots otherwise); a single query token attends to all keys;
* a materialized mask that is exactly a causal pattern (or all-visible): the matching kernel. A causal
  mask with ``q_len != k_len`` during generation with a KV cache (several new tokens after a prefill)
  is bottom-right aligned, and runs on the bottom-right causal kernel, the ``flash_attn_func`` semantics;
* any other mask (a padding mask, another pattern, an additive bias): the masked kernel, which reads
  the mask in place (broadcast over heads, cut to the keys in use);
* attention dropout in training (transformers passes ``module.attention_dropout`` while the module is
  training, 0 otherwise) runs on the same kernels, with a keep-mask drawn from torch's default
  generator of the query's device;
* packed documents, batch 1: the ``cu_seq_lens_q/k`` and ``max_length_q/k`` keyword arguments (what
  ``DataCollatorWithFlattening(return_flash_attn_kwargs=True)`` produces; offsets converted to int32,
  max lengths ints or 0-dim tensors), or else ``position_ids`` that start a new document (a position that
  is not the previous one plus one) inside the row, with no mask or a merely causal one:
  :func:`flashattn.flash_attn_varlen_func` over the ``(S, H, D)`` rows, each document causal on its own
  (non-causal where the module is). Deriving the offsets from position_ids reads two numbers on the host
  (one synchronization), cached across layers for the same position_ids tensor
  (:func:`flashattn.integrations.packing.cu_seqlens_from_position_ids`);
* a 2-dim ``(B, S)`` padding mask (what the "fattn" mask function passes for padded batches): the real
  tokens are gathered, run through ``flash_attn_varlen_func`` and scattered back with zeros at the pads
  (one host synchronization per layer: the token count);
* everything else goes to transformers' own ``sdpa`` implementation, with a warning naming the reason,
  once per reason: a dropout probability outside [0, 1), inputs flashattn's kernels do not serve (float32
  CUDA tensors, head dims above 256, GPUs older than sm_80, a build without CUDA kernels, ...), a mask
  of another dtype than bool, float32 or the query's, ``position_bias``.
* attention sinks (``s_aux``, gpt-oss's per-head sink logits) and score soft-capping (``softcap``,
  Gemma 2's) run on the same kernels, gradients included; a call with either that would fall back
  raises ``ValueError`` instead (transformers' sdpa has neither), and so does ``softcap`` with a
  floating mask (the kernels cap scores under boolean masks only; the "fattn" mask function builds
  boolean ones).

The mask function registered for "fattn" (:func:`flashattn_mask`, transformers with
``AttentionMaskInterface``) returns None or the 2-dim padding mask for plain and sliding-window causal
attention without a cache offset and None for causal documents packed by position_ids, so no S x S mask
is built for them; for anything else it returns sdpa's boolean 4-dim mask. A sliding-window layer's
call (transformers passes its ``sliding_window`` W) then runs the kernels with ``window_size=(W - 1,
0)``, key blocks outside the window skipped. Where a packed, padded or windowed call falls back to sdpa,
it gets the equivalent dense mask.

Checking whether a mask is a causal pattern reads it once (one host synchronization), cached for as
long as the same mask tensor is passed to the next layers.
"""
from __future__ import annotations

import math
import warnings
import weakref
from collections import Counter
from typing import Dict, Optional, Set, Tuple

import torch

try:
    import transformers
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
except ImportError as exc:  # pragma: no cover - exercised only without transformers
    raise ImportError(
        "flashattn.integrations.transformers needs HuggingFace transformers with AttentionInterface "
        "(4.51 or newer): pip install 'flashattn[transformers]' or pip install transformers"
    ) from exc

from .. import ops
from .._fa2_common import window_keys
from ..reference import causal_visibility
from ..sdpa import fallback_reason
from ..varlen import flash_attn_varlen_func
from . import packing

__all__ = [
    "ATTN_IMPLEMENTATION",
    "classify_mask",
    "flashattn_attention_forward",
    "flashattn_mask",
    "path_counts",
    "register",
]

ATTN_IMPLEMENTATION = "fattn"

FULL = "full"
CAUSAL_TOP_LEFT = "causal_top_left"
CAUSAL_BOTTOM_RIGHT = "causal_bottom_right"
MASKED = "masked"
FALLBACK = "fallback"
# flash_attn_varlen_func over documents packed into one row (cu_seq_lens_q/k kwargs, or packed position_ids)
VARLEN_PACKED = "varlen_packed"
# flash_attn_varlen_func over the real tokens of a (B, S) padding mask, scattered back with zeros at the pads
VARLEN_UNPADDED = "varlen_unpadded"

# How many attention calls took each path (FULL, CAUSAL_TOP_LEFT, ..., VARLEN_UNPADDED, FALLBACK): for
# diagnostics and tests. Not updated inside torch.compile.
path_counts: Counter = Counter()

_warned_reasons: Set[str] = set()
# id(mask) -> (weak reference, mask._version, q_len, kv_len, classification)
_mask_cache: Dict[int, tuple] = {}
_MASK_CACHE_SIZE = 16


def _warn_fallback_once(reason: str) -> None:
    if torch.compiler.is_compiling() or reason in _warned_reasons:
        return
    _warned_reasons.add(reason)
    warnings.warn(f"flashattn ({ATTN_IMPLEMENTATION}): {reason}; falling back to transformers' sdpa attention",
                  stacklevel=3)


def _count(path: str) -> None:
    if not torch.compiler.is_compiling():
        path_counts[path] += 1


# --------------------------------------------------------------------------------------------------
# Masks
# --------------------------------------------------------------------------------------------------


def _visible_keys(mask: torch.Tensor) -> Optional[torch.Tensor]:
    """Boolean mask of visible keys, or None when the mask carries values other than "visible" and "blocked"
    (an additive bias). Boolean masks: True is visible. Float masks (additive): 0 is visible, -inf or a value
    at most half the dtype's minimum (what transformers writes) is blocked."""
    if mask.dtype == torch.bool:
        return mask
    if not mask.is_floating_point():
        return None
    blocked = mask <= torch.finfo(mask.dtype).min / 2
    if not bool(((mask == 0) | blocked).all()):
        return None
    return ~blocked


def _classify(mask: torch.Tensor, q_len: int, kv_len: int) -> Optional[str]:
    if mask.dim() != 4 or mask.shape[-2] != q_len or mask.shape[-1] < kv_len:
        return None
    visible = _visible_keys(mask[..., :kv_len])
    if visible is None:
        return None
    if bool(visible.all()):
        return FULL
    for kind, bottom_right in ((CAUSAL_TOP_LEFT, False), (CAUSAL_BOTTOM_RIGHT, True)):
        pattern = causal_visibility(q_len, kv_len, bottom_right, device=visible.device)
        if torch.equal(visible, pattern.expand_as(visible)):
            return kind
    return None


def _version_of(t: torch.Tensor) -> Optional[int]:
    try:
        return t._version
    except RuntimeError:  # inference tensors have no version counter (and cannot change outside inference mode)
        return None


def classify_mask(mask: torch.Tensor, q_len: int, kv_len: int) -> Optional[str]:
    """What a 4-dim ``(B or 1, H or 1, q_len, >= kv_len)`` attention mask asks for.

    Returns "full" (every key visible), "causal_top_left" (key j visible to query i iff ``j <= i``),
    "causal_bottom_right" (iff ``j <= i + kv_len - q_len``), or None for anything else: padding, windows,
    bidirectional blocks, additive biases. With ``q_len == kv_len`` both causal alignments are the same
    mask and "causal_top_left" is returned. Masks longer than kv_len (static caches) are cut to kv_len.
    """
    if torch.compiler.is_compiling():
        return _classify(mask, q_len, kv_len)
    key = id(mask)
    hit = _mask_cache.get(key)
    if hit is not None and hit[0]() is mask and hit[1:4] == (_version_of(mask), q_len, kv_len):
        return hit[4]
    result = _classify(mask, q_len, kv_len)
    if len(_mask_cache) >= _MASK_CACHE_SIZE:
        _mask_cache.clear()
    try:
        _mask_cache[key] = (weakref.ref(mask), _version_of(mask), q_len, kv_len, result)
    except TypeError:  # not weak-referenceable: just do not cache
        pass
    return result


# --------------------------------------------------------------------------------------------------
# The attention function
# --------------------------------------------------------------------------------------------------


def _packed_offsets(query, key, attention_mask, kwargs):
    """(cu_seqlens_q, cu_seqlens_k, max_q, max_k) for documents packed into the one row of a batch-1 call,
    from the cu_seq_lens_q/k and max_length_q/k keyword arguments or else from packed position_ids; None
    when the call is not packed. Only looked at where the mask allows: None, or a 4-dim mask that is just
    causal / all-visible (older transformers build one; it says nothing about the documents)."""
    names = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")
    given = {name: kwargs.get(name) for name in names}
    q_len, kv_len = query.size(2), key.size(2)
    if any(value is not None for value in given.values()):
        missing = [name for name, value in given.items() if value is None]
        if missing:
            raise ValueError(f"flashattn ({ATTN_IMPLEMENTATION}): packed sequences need all of {', '.join(names)}; "
                             f"missing {', '.join(missing)}")
        if query.size(0) != 1:
            raise ValueError(f"flashattn ({ATTN_IMPLEMENTATION}): cu_seq_lens_q/k describe documents packed into one "
                             f"row, so the batch must be 1; got query of shape {tuple(query.shape)}")
        if attention_mask is not None and attention_mask.dim() == 2:
            raise ValueError(f"flashattn ({ATTN_IMPLEMENTATION}): cu_seq_lens_q/k and a 2-dim padding mask together "
                             "are ambiguous; pass one of them")
        if attention_mask is not None and classify_mask(attention_mask, q_len, kv_len) not in (FULL, CAUSAL_TOP_LEFT):
            return None  # a mask of its own (it encodes the documents): the masked kernel
        device = query.device
        return (packing.check_cu_seqlens("cu_seq_lens_q", given["cu_seq_lens_q"], device),
                packing.check_cu_seqlens("cu_seq_lens_k", given["cu_seq_lens_k"], device),
                packing.check_max_length("max_length_q", given["max_length_q"]),
                packing.check_max_length("max_length_k", given["max_length_k"]))
    position_ids = kwargs.get("position_ids")
    if (not isinstance(position_ids, torch.Tensor) or query.size(0) != 1 or q_len != kv_len or q_len <= 1
            or position_ids.dim() != 2 or position_ids.shape != (1, q_len)):
        return None
    if attention_mask is not None and (attention_mask.dim() != 4
                                       or classify_mask(attention_mask, q_len, kv_len) not in (FULL, CAUSAL_TOP_LEFT)):
        return None
    derived = packing.cu_seqlens_from_position_ids(position_ids)
    if derived is None:
        return None
    cu_seqlens, longest = derived
    return cu_seqlens, cu_seqlens, longest, longest


def _dense_fallback_mask(query, key, attention_mask, packed, causal):
    """The 4-dim boolean mask that makes transformers' sdpa compute what the varlen paths do (for a
    fallback only: it is (B, 1, q_len, kv_len))."""
    q_len, kv_len = query.size(2), key.size(2)
    device = query.device
    if packed is not None:  # batch 1, q_len == kv_len: same document (and causal)
        cu = packed[0].long()
        doc = torch.searchsorted(cu[1:], torch.arange(q_len, device=device), right=True)
        mask = doc[:, None] == doc[None, :]
    elif attention_mask is None:  # no padding (a sliding-window layer's call): every key
        mask = torch.ones(q_len, kv_len, dtype=torch.bool, device=device)
    else:  # (B, kv_len) padding mask; padded queries see themselves only (their rows are zeroed after)
        keys = attention_mask.bool()[:, None, :]  # (B, 1, kv_len)
        mask = keys.expand(-1, q_len, -1).clone()
        diag = torch.arange(q_len, device=device) + (kv_len - q_len)
        mask[:, torch.arange(q_len, device=device), diag] = True
        mask = mask[:, None]
    if causal:
        mask = mask & causal_visibility(q_len, kv_len, True, device=device)
    return mask if mask.dim() == 4 else mask[None, None]


def _sliding_window(query, key, attention_mask, is_causal, kwargs) -> Tuple[int, int]:
    """The kernels' window_size for a call of a sliding-window layer (transformers passes the model's
    ``sliding_window`` W: each query sees itself and the W - 1 keys before it), ``(W - 1, 0)``, where no
    4-dim mask carries the window already (flashattn_mask leaves it out for the kernels), else (-1, -1)."""
    window = kwargs.get("sliding_window")
    if (isinstance(window, bool) or not isinstance(window, int) or window <= 0 or not is_causal
            or key.dim() != 4 or key.size(2) <= window
            or (attention_mask is not None and (not isinstance(attention_mask, torch.Tensor) or attention_mask.dim() != 2))):
        return (-1, -1)
    return (window - 1, 0)


def _plan(module, query, key, value, attention_mask, dropout, is_causal, kwargs) -> Tuple[Optional[str], str]:
    """(fallback reason or None, path) for one call."""
    if dropout and not 0.0 <= dropout < 1.0:
        return f"an attention dropout of {dropout} (outside [0, 1)) is not supported by flashattn", ""
    if kwargs.get("position_bias") is not None:
        return "a position bias is not supported by flashattn", ""
    if query.dim() != 4 or key.dim() != 4 or value.dim() != 4:
        return "query/key/value that are not 4-dim (batch, heads, seqlen, head_dim) are not supported", ""
    heads_q, heads_kv = query.size(1), key.size(1)
    if heads_kv == 0 or heads_q % heads_kv != 0 or value.size(1) != heads_kv:
        return f"{heads_q} query heads over {heads_kv} key/value heads (not a whole group size)", ""
    reason = fallback_reason(query, key, value, None, 0.0, True)
    if reason is not None:
        return reason, ""

    q_len, kv_len = query.size(2), key.size(2)
    if attention_mask is None:
        # transformers omits the mask where SDPA's is_causal flag (top-left) is enough, as its sdpa path does.
        causal = bool(is_causal) and q_len > 1
        return None, CAUSAL_TOP_LEFT if causal else FULL
    if not isinstance(attention_mask, torch.Tensor):
        return f"a {type(attention_mask).__name__} attention mask is not supported by flashattn", ""
    if attention_mask.dim() == 2:
        if attention_mask.size(0) != query.size(0) or attention_mask.size(1) != kv_len or q_len > kv_len:
            raise ValueError(f"flashattn ({ATTN_IMPLEMENTATION}): a 2-dim padding mask must be (batch, kv_len) = "
                             f"{(query.size(0), kv_len)}, got {tuple(attention_mask.shape)}")
        return None, VARLEN_UNPADDED
    if attention_mask.dim() != 4 or attention_mask.shape[-2] != q_len or attention_mask.shape[-1] < kv_len:
        return f"an attention mask of shape {tuple(attention_mask.shape)} is not supported by flashattn", ""
    if attention_mask.dtype not in (torch.bool, torch.float32, query.dtype):
        return f"a {attention_mask.dtype} attention mask with {query.dtype} inputs is not supported by flashattn", ""
    path = classify_mask(attention_mask, q_len, kv_len)
    return None, MASKED if path is None else path


def flashattn_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: Optional[torch.Tensor],
    dropout: float = 0.0,
    scaling: Optional[float] = None,
    is_causal: Optional[bool] = None,
    **kwargs,
) -> Tuple[torch.Tensor, None]:
    """transformers attention function: query ``(B, Hq, S, D)``, key/value ``(B, Hkv, S_kv, D)`` ->
    ``((B, S, Hq, D), None)``. See the module docstring for what runs on flashattn's kernels."""
    causal_module = getattr(module, "is_causal", True) if is_causal is None else is_causal
    packed = None
    if query.dim() == 4 and key.dim() == 4 and (attention_mask is None or isinstance(attention_mask, torch.Tensor)):
        packed = _packed_offsets(query, key, attention_mask, kwargs)
    reason, path = _plan(module, query, key, value, attention_mask, dropout, causal_module, kwargs)
    if path and packed is not None:
        path = VARLEN_PACKED
    varlen_causal = bool(causal_module) and query.size(2) > 1
    sink = kwargs.get("s_aux")
    softcap = float(kwargs.get("softcap") or 0.0)
    window = _sliding_window(query, key, attention_mask, causal_module, kwargs)
    if reason is not None and (sink is not None or softcap):
        raise ValueError(f"attn_implementation={ATTN_IMPLEMENTATION!r}: this call has attention sinks (s_aux) or "
                         f"softcap, which transformers' sdpa, its fallback, does not support, and {reason}; "
                         "use 'eager'")
    if softcap and path == MASKED and attention_mask.dtype != torch.bool:
        raise ValueError(f"attn_implementation={ATTN_IMPLEMENTATION!r}: softcap with a floating attention mask is "
                         "not supported by flashattn's kernels (boolean masks are); use 'eager'")
    if reason is not None:
        _warn_fallback_once(reason)
        _count(FALLBACK)
        padded = isinstance(attention_mask, torch.Tensor) and attention_mask.dim() == 2
        if packed is not None or window != (-1, -1) or padded:
            # What the varlen paths compute, as a dense mask sdpa reads (S x S memory: a fallback only).
            dense = _dense_fallback_mask(query, key, attention_mask, packed, varlen_causal or window != (-1, -1))
            if window != (-1, -1):
                diagonal = torch.arange(query.size(2), device=query.device)[:, None] + key.size(2) - query.size(2)
                dense = dense & window_keys(diagonal, torch.arange(key.size(2), device=query.device), window)
            kwargs = {name: value for name, value in kwargs.items()
                      if name not in ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")}
            out, weights = sdpa_attention_forward(module, query, key, value, dense, dropout=dropout, scaling=scaling,
                                                  is_causal=False, **kwargs)
            if packed is None and attention_mask is not None:
                out = out * attention_mask[:, -query.size(2):, None, None].to(out.dtype)  # zeros at padded queries
            return out, weights
        # is_causal goes on as given: transformers' sdpa derives its own flag from the mask when it is None.
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    _count(path)
    if scaling is None:
        scaling = 1.0 / math.sqrt(query.size(-1))
    # (B, H, S, D) -> (B, S, H, D) views; the kernels take any strides but a contiguous last dim.
    q, k, v = (t.transpose(1, 2) for t in (query, key, value))
    q, k, v = (t if t.size(-1) <= 1 or t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    if path == VARLEN_PACKED:
        # One row of packed documents: (1, S, H, D) -> (S, H, D) views, each document attends within itself.
        cu_q, cu_k, max_q, max_k = packed
        out = flash_attn_varlen_func(q[0], k[0], v[0], cu_q, cu_k, max_q, max_k, dropout_p=float(dropout or 0.0),
                                     softmax_scale=float(scaling), causal=varlen_causal, window_size=window,
                                     learnable_sink=sink, softcap=softcap)
        return out.unsqueeze(0), None  # (1, S, Hq, D)
    if path == VARLEN_UNPADDED:
        # (B, kv_len) padding mask: the real tokens (T, H, D), per row; queries are the mask's last q_len columns.
        layout_k = packing.unpad(attention_mask)
        layout_q = layout_k if q.size(1) == k.size(1) else packing.unpad(attention_mask[:, -q.size(1):])
        out = flash_attn_varlen_func(packing.gather(q, layout_q), packing.gather(k, layout_k),
                                     packing.gather(v, layout_k), layout_q.cu_seqlens, layout_k.cu_seqlens,
                                     layout_q.max_seqlen, layout_k.max_seqlen, dropout_p=float(dropout or 0.0),
                                     softmax_scale=float(scaling), causal=varlen_causal, window_size=window,
                                     learnable_sink=sink, softcap=softcap)
        return packing.pad(out, layout_q), None  # (B, q_len, Hq, D), zeros at the pads
    causal = path in (CAUSAL_TOP_LEFT, CAUSAL_BOTTOM_RIGHT)
    bottom_right = path == CAUSAL_BOTTOM_RIGHT
    if window != (-1, -1):  # a causal call without a mask: the window around each query's bottom-right diagonal
        causal = bottom_right = True
    mask = None
    if path == MASKED:
        # (B or 1, H or 1, q_len, >= kv_len) -> a (B, Hq, q_len, kv_len) view, read in place.
        mask = attention_mask[..., : k.size(1)].expand(q.size(0), q.size(2), q.size(1), k.size(1))
    out, _ = ops.attention(q, k, v, float(scaling), causal, bottom_right, False, mask, float(dropout or 0.0), sink=sink,
                           softcap=softcap, window_left=window[0], window_right=window[1])  # (B, S, Hq, D)
    return out, None


# --------------------------------------------------------------------------------------------------
# Registration
# --------------------------------------------------------------------------------------------------


def _closure(fn) -> dict:
    code, cells = getattr(fn, "__code__", None), getattr(fn, "__closure__", None) or ()
    if code is None:
        return {}
    try:
        return {name: cell.cell_contents for name, cell in zip(code.co_freevars, cells)}
    except ValueError:  # an empty cell
        return {}


def _is_packed_causal(mask_function) -> bool:
    """Whether transformers' mask function is its causal one and'ed with packed documents (what
    ``create_causal_mask`` builds for packed position_ids; 5.x also remaps the positions): then flashattn_attention_forward derives the
    documents from position_ids itself. Recognized by structure; anything else is not."""
    from transformers import masking_utils as mu

    if not getattr(mask_function, "__qualname__", "").startswith("and_masks."):
        return False
    parts = _closure(mask_function).get("mask_functions")
    if not isinstance(parts, tuple) or len(parts) != 2:
        return False
    causal, same_document = parts
    if getattr(causal, "__qualname__", "").startswith("remap_positions_for_packed_sequence."):  # 5.x
        causal = _closure(causal).get("mask_function")
    # 4.53-4.57 put the causal function itself first: causal over the row's indices.
    return (causal is mu.causal_mask_function
            and getattr(same_document, "__qualname__", "").startswith("packed_sequence_mask_function."))


def _is_sliding_causal(mask_function, window) -> bool:
    """Whether transformers' mask function is its sliding-window causal one for a window of `window` keys
    (``and_masks(sliding_window_overlay(window), causal_mask_function)``), recognized by structure."""
    from transformers import masking_utils as mu

    if not isinstance(window, int) or not getattr(mask_function, "__qualname__", "").startswith("and_masks."):
        return False
    parts = _closure(mask_function).get("mask_functions")
    if not isinstance(parts, tuple) or len(parts) != 2 or mu.causal_mask_function not in parts:
        return False
    overlay = parts[0] if parts[1] is mu.causal_mask_function else parts[1]
    return (getattr(overlay, "__qualname__", "").startswith("sliding_window_overlay.")
            and _closure(overlay).get("sliding_window") == window)


def flashattn_mask(*args, **kwargs):
    """transformers mask function for "fattn" (``AttentionMaskInterface``): no S x S mask where the varlen
    paths serve the call, else sdpa's boolean mask.

    * plain causal attention without a cache offset (``q_length == kv_length``): None without padding,
      the ``(B, S)`` padding mask (boolean) with it, unpadded by :func:`flashattn_attention_forward`;
    * causal attention over documents packed by position_ids (no padding mask): None, the attention
      function derives the documents from the ``position_ids`` it is passed;
    * sliding-window causal attention without a cache offset: as plain causal attention, the attention
      function passing the layer's ``sliding_window`` to the kernels as their window;
    * anything else (chunks, bidirectional or custom overlays, KV-cache offsets): sdpa's.

    Takes the keyword arguments transformers passes (5.x: ``q_length``/``q_offset``; 4.53-4.57:
    ``cache_position``); positional calls go to sdpa's mask function unread.
    """
    from transformers import masking_utils as mu

    if args:
        return mu.sdpa_mask(*args, **kwargs)
    mask_function = kwargs.get("mask_function", mu.causal_mask_function)
    attention_mask = kwargs.get("attention_mask")
    kv_length, kv_offset = kwargs.get("kv_length"), kwargs.get("kv_offset", 0)
    q_length, q_offset = kwargs.get("q_length"), kwargs.get("q_offset", 0)
    if q_length is None and isinstance(kwargs.get("cache_position"), torch.Tensor):
        # Older signature: the queries' positions. With as many keys as queries and no key offset, the
        # keys are the queries themselves (nothing cached before them).
        q_length = kwargs["cache_position"].shape[0]
    no_offset = (isinstance(q_offset, int) and q_offset == 0 and isinstance(kv_offset, int) and kv_offset == 0)
    if no_offset and q_length is not None and q_length == kv_length:
        plain = mask_function is mu.causal_mask_function or _is_sliding_causal(mask_function, kwargs.get("local_size"))
        if plain and (attention_mask is None or (attention_mask.dim() == 2 and attention_mask.size(-1) == kv_length)):
            if attention_mask is None or bool(attention_mask.all()):
                return None
            return attention_mask.bool()
        if attention_mask is None and _is_packed_causal(mask_function):
            return None
    return mu.sdpa_mask(**kwargs)


def _mask_interface():
    try:
        from transformers.masking_utils import AttentionMaskInterface
    except ImportError:  # older transformers build masks inside each model (4D float masks, read just the same)
        return None
    return AttentionMaskInterface


def _treated_as_flash_attention(name: str) -> bool:
    try:
        from transformers.utils.generic import is_flash_attention_requested
    except ImportError:
        return name.startswith("flash_attention")
    return bool(is_flash_attention_requested(requested_attention_implementation=name))


def register(name: str = ATTN_IMPLEMENTATION) -> str:
    """Registers flashattn under ``name`` (default "fattn") with transformers; returns the name.

    The attention function goes to ``transformers.AttentionInterface``; where transformers has an
    ``AttentionMaskInterface``, the name gets :func:`flashattn_mask` (None / the 2-dim padding mask where
    the varlen paths serve the call, else sdpa's boolean masks), which :func:`flashattn_attention_forward`
    reads. Calling it
    again is harmless. Raises ValueError for a name the installed transformers would treat as one of
    its FlashAttention implementations (in 5.x, any name containing "flash").
    """
    if _treated_as_flash_attention(name):
        raise ValueError(
            f"transformers {transformers.__version__} treats attn_implementation={name!r} as a FlashAttention "
            f"kernel to load and would not call flashattn; register under another name (the default is "
            f"{ATTN_IMPLEMENTATION!r})"
        )
    AttentionInterface.register(name, flashattn_attention_forward)
    mask_interface = _mask_interface()
    if mask_interface is not None:
        mask_interface.register(name, flashattn_mask)
    return name


register()
