"""Compatibility alias, kept so that imports written against ``flashattn.functional`` keep working: the
module was split into :mod:`flashattn.sdpa` (the SDPA drop-in) and :mod:`flashattn.flash_attn_interface`
(the FlashAttention-2 API). New code imports these names from ``flashattn``; this module re-exports
only the public ones (private helpers and state live in the new modules)."""
from .flash_attn_interface import flash_attn_func, flash_attn_kvpacked_func, flash_attn_qkvpacked_func
from .ops import MAX_HEAD_DIM  # noqa: F401  (public here before the split)
from .sdpa import scaled_dot_product_attention

__all__ = ["scaled_dot_product_attention", "flash_attn_func", "flash_attn_kvpacked_func", "flash_attn_qkvpacked_func"]
