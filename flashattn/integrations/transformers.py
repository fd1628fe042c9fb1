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
* everything else goes to transformers' own ``sdpa`` implementation, with a warning naming the reason,
  once per reason: a dropout probability outside [0, 1), inputs flashattn's kernels do not serve (float32
  CUDA tensors, head dims above 256, GPUs older than sm_80, a build without CUDA kernels, ...), a mask
  of another dtype than bool, float32 or the query's, ``position_bias``.
* ``softcap`` and attention sinks (``s_aux``) raise ``ValueError``: neither flashattn nor SDPA has them.

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
from ..reference import causal_visibility
from ..sdpa import fallback_reason

__all__ = [
    "ATTN_IMPLEMENTATION",
    "classify_mask",
    "flashattn_attention_forward",
    "path_counts",
    "register",
]

ATTN_IMPLEMENTATION = "fattn"

FULL = "full"
CAUSAL_TOP_LEFT = "causal_top_left"
CAUSAL_BOTTOM_RIGHT = "causal_bottom_right"
MASKED = "masked"
FALLBACK = "fallback"

# How many attention calls took each path (FULL, CAUSAL_TOP_LEFT, CAUSAL_BOTTOM_RIGHT, FALLBACK): for
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


def _plan(module, query, key, value, attention_mask, dropout, is_causal, kwargs) -> Tuple[Optional[str], str]:
    """(fallback reason or None, path) for one call."""
    if kwargs.get("softcap") is not None:
        raise ValueError(f"attn_implementation={ATTN_IMPLEMENTATION!r} does not support softcap; use 'eager'")
    if kwargs.get("s_aux") is not None:
        raise ValueError(f"attn_implementation={ATTN_IMPLEMENTATION!r} does not support attention sinks (s_aux); "
                         "use 'eager'")
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
    reason, path = _plan(module, query, key, value, attention_mask, dropout, causal_module, kwargs)
    if reason is not None:
        _warn_fallback_once(reason)
        _count(FALLBACK)
        # is_causal goes on as given: transformers' sdpa derives its own flag from the mask when it is None.
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    _count(path)
    if scaling is None:
        scaling = 1.0 / math.sqrt(query.size(-1))
    # (B, H, S, D) -> (B, S, H, D) views; the kernels take any strides but a contiguous last dim.
    q, k, v = (t.transpose(1, 2) for t in (query, key, value))
    q, k, v = (t if t.size(-1) <= 1 or t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    causal = path in (CAUSAL_TOP_LEFT, CAUSAL_BOTTOM_RIGHT)
    mask = None
    if path == MASKED:
        # (B or 1, H or 1, q_len, >= kv_len) -> a (B, Hq, q_len, kv_len) view, read in place.
        mask = attention_mask[..., : k.size(1)].expand(q.size(0), q.size(2), q.size(1), k.size(1))
    out, _ = ops.attention(q, k, v, float(scaling), causal, path == CAUSAL_BOTTOM_RIGHT, False, mask,
                           float(dropout or 0.0))  # (B, S, Hq, D)
    return out, None


# --------------------------------------------------------------------------------------------------
# Registration
# --------------------------------------------------------------------------------------------------


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
    ``AttentionMaskInterface``, the name gets the same mask function as "sdpa" (boolean masks, left out
    where causal masking alone is right), which :func:`flashattn_attention_forward` reads. Calling it
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
        mask_interface.register(name, mask_interface._global_mapping["sdpa"])
    return name


register()
