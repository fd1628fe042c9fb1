"""The part of flashattn built against torch's stable ABI alone: ``flashattn._C_stable``, one library
(``_C_stable.abi3.so``) that loads under every torch from 2.11 on and every CPython from 3.10 on,
where the main extension ``flashattn._C`` serves only the torch it was compiled against
(docs/stable-abi.md is the plan for moving the rest).

Its ops live in the ``flashattn_stable`` namespace. Today one: ``torch.ops.flashattn_stable.dropout_keep_mask``,
the same function as ``torch.ops.flashattn.dropout_keep_mask`` (the dropout keep-mask, CPU and CUDA).

    from flashattn import stable_abi
    stable_abi.load()   # True once the library is loaded (it is not loaded by ``import flashattn``)
"""
from __future__ import annotations

import glob
import os

import torch

_PACKAGE = os.path.dirname(os.path.abspath(__file__))
_loaded = False


def library_path() -> str | None:
    """The built library's file in the package, or None when this build has none."""
    found = sorted(glob.glob(os.path.join(_PACKAGE, "_C_stable*.so")))
    return found[0] if found else None


def load() -> bool:
    """Loads the library into torch (its ops appear under ``torch.ops.flashattn_stable``) and registers
    their fake kernels for torch.compile. Returns False when this build has no such library; a library
    that fails to load raises (an OSError or RuntimeError naming the file)."""
    global _loaded
    if _loaded:
        return True
    path = library_path()
    if path is None:
        return False
    torch.ops.load_library(path)
    _register_fakes()
    _loaded = True
    return True


def _register_fakes() -> None:
    @torch.library.register_fake("flashattn_stable::dropout_keep_mask")
    def _keep_mask_fake(rng_state, batch, heads, seqlen_q, seqlen_k, dropout_p):
        return rng_state.new_empty((batch, heads, seqlen_q, seqlen_k), dtype=torch.bool)
