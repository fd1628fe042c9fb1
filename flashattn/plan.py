"""The planner's switches and choices, for tests, measurements and bug reports.

Every CUDA call is planned before anything runs (``csrc/plan.h``): which kernel path serves it (sm90
on compute capability 9.0 where it applies, sm80 otherwise), which compiled variant and grid, and what
the attention mask's prepasses compute. :func:`plan_fwd` and :func:`plan_bwd` show that plan for a
described call, also on a machine without a GPU. The switches (:func:`options`) replace one decision
each; the process starts with the values of the environment variables named below, read once when the
extension is first used:

- ``force_sm80`` (``FLASHATTN_FORCE_SM80=1``): the sm80 kernels on every GPU;
- ``sm90_multicast`` (``FLASHATTN_SM90_MULTICAST=0|1``): K/V multicast off, or on wherever it fits;
- ``sm90_wide_key_blocks`` (``FLASHATTN_SM90_WIDE_KEY_BLOCKS=0|1``): 176-key blocks at width 128 off, or
  on for every unmasked launch there (by default: rows of 2048 keys or more without causal masking);
- ``sm90_narrow_tail`` (``FLASHATTN_SM90_NARROW_TAIL=0``): full-width last key blocks;
- ``sm90_dynamic_tail`` (``FLASHATTN_SM90_STATIC_SCHEDULE=1``): the causal schedule's static pairs only;
- ``sm90_staged_output`` (``FLASHATTN_SM90_DIRECT_OUTPUT=1``): O stored by the threads, not by TMA
  (compute-sanitizer's initcheck does not see TMA stores as writes);
- ``sm90_bwd_wide_steps`` (``FLASHATTN_SM90_BWD_WIDE_STEPS=0``): the sm90 backward in 64-query steps
  everywhere (by default the unmasked kernel at tile width 64 takes 128 queries a step);
- ``smem_per_block_cap`` (no environment variable; 0): plan as if the GPU offered at most this many
  bytes of shared memory per block, so that a Hopper GPU shows what an A100 or a consumer GPU gets;
- ``decode_stages`` (``FLASHATTN_DECODE_STAGES=2|3``; 0): the decode kernel's ring stages per warp at the
  head-dim widths that have such a form (2 and 3 up to 128, 2 at 192; 0: the default depth, 4 up to 128),
  so that several of its thread blocks share an SM. Measured on an H100 it gains nothing on long caches
  and loses on short ones (docs/perf-log.md); it stays for experiments on the split rule.

``sm90_multicast`` and ``sm90_wide_key_blocks`` take ``"auto"`` (the planner's choice), ``"on"``/``True``
or ``"off"``/``False``; ``smem_per_block_cap`` and ``decode_stages`` ints; the others are booleans. Options are process-wide and not synchronised: change
them while no other thread launches attention.
"""
from __future__ import annotations

import contextlib
from typing import Any, Dict, Iterator

from . import _C

__all__ = ["current_options", "options", "plan_bwd", "plan_fwd", "set_options"]


def _planner():
    if not hasattr(_C, "plan_fwd"):
        raise RuntimeError("flashattn was built without its CUDA kernels: there is no GPU planner "
                           "(rebuild with a CUDA toolkit, FLASHATTN_BUILD_CUDA=1)")
    return _C


def set_options(**changes: Any) -> None:
    """Sets some of the planner's switches for the process (the others keep their values)."""
    _planner().set_plan_options(changes)


@contextlib.contextmanager
def options(**changes: Any) -> Iterator[Dict[str, Any]]:
    """The planner's switches with ``changes`` applied inside the block, restored after it; yields
    them. ``with flashattn.plan.options(force_sm80=True): ...`` runs the sm80 kernels on a Hopper GPU."""
    planner = _planner()
    before = planner.plan_options()
    planner.set_plan_options(changes)
    try:
        yield planner.plan_options()
    finally:
        planner.set_plan_options(before)


def current_options() -> Dict[str, Any]:
    """The planner's switches now."""
    return _planner().plan_options()


def plan_fwd(call: Dict[str, Any], **option_changes: Any) -> Dict[str, Any]:
    """The forward's plan for a call described by ``call``, a dict of: ``batch``, ``seqlen_q``,
    ``seqlen_k``, ``heads_q``, ``heads_kv``, ``head_dim``, ``scale``, ``is_causal``, ``causal_offset``,
    ``dtype`` ("bf16" or "fp16"), ``mask`` (None, "bool" or "additive") with ``mask_batch_stride_zero``,
    ``mask_head_stride_zero`` and ``mask_row_stride_zero``, ``dropout``, ``tma`` (q, k and v
    TMA-describable; default True), ``out_tma``, and the device: ``cc`` ((major, minor), default
    (9, 0)), ``num_sms`` (132), ``pair_clusters`` (num_sms // 2), ``smem_per_block`` (bytes; 0: not
    known, not checked). The plan's ``smem`` is the sm80 kernel's shared memory per block against
    that limit (``bytes`` 0 on the sm90 path). The current options apply, with ``option_changes``
    over them."""
    return _planner().plan_fwd(dict(call), dict(option_changes))


def plan_bwd(call: Dict[str, Any], **option_changes: Any) -> Dict[str, Any]:
    """The backward's plan for a call described as for :func:`plan_fwd`, plus ``deterministic`` and
    ``dmask`` (the mask's gradient is written)."""
    return _planner().plan_bwd(dict(call), dict(option_changes))
