"""flashattn: exact attention (FlashAttention) kernels for PyTorch, CPU and CUDA (sm80+).

Two public APIs over the same custom ops (``torch.ops.flashattn.fwd`` / ``bwd``):

* :func:`scaled_dot_product_attention`: drop-in for ``torch.nn.functional.scaled_dot_product_attention``
  (layout ``(B, H, L, D)``, top-left causal mask); calls the kernels do not cover fall back to torch
  (see :mod:`flashattn.sdpa`).
* :func:`flash_attn_func`, :func:`flash_attn_kvpacked_func`, :func:`flash_attn_qkvpacked_func`: the
  FlashAttention-2 Python API (layout ``(B, S, H, D)``, bottom-right causal mask; see
  :mod:`flashattn.flash_attn_interface`), and its
  variable-length functions :func:`flash_attn_varlen_func`, :func:`flash_attn_varlen_kvpacked_func`,
  :func:`flash_attn_varlen_qkvpacked_func` (packed ``(total, H, D)`` rows; see :mod:`flashattn.varlen`),
  and :func:`flash_attn_with_kvcache` (attention over a KV cache that grows in place; see
  :mod:`flashattn.kvcache`).

:func:`attention_reference` is the plain-PyTorch definition both are tested against; :mod:`flashattn.plan`
shows and switches the choices the GPU planner makes (which kernel path and variant runs a call).
"""
from . import ops, plan
from .flash_attn_interface import flash_attn_func, flash_attn_kvpacked_func, flash_attn_qkvpacked_func
from .kvcache import flash_attn_with_kvcache, get_scheduler_metadata
from .ops import cuda_kernels_built
from .reference import attention_reference
from .sdpa import scaled_dot_product_attention
from .varlen import flash_attn_varlen_func, flash_attn_varlen_kvpacked_func, flash_attn_varlen_qkvpacked_func

__version__ = "0.1.0"

__all__ = [
    "__version__",
    "attention_reference",
    "cuda_kernels_built",
    "flash_attn_func",
    "flash_attn_kvpacked_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_varlen_func",
    "flash_attn_varlen_kvpacked_func",
    "flash_attn_varlen_qkvpacked_func",
    "flash_attn_with_kvcache",
    "get_scheduler_metadata",
    "ops",
    "plan",
    "scaled_dot_product_attention",
]
