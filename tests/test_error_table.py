"""Every row of the bad-input table in docs/errors.md, checked against the code.

The table is the single source of truth for what each misuse does: this module parses its rows
(id, API, misuse, device, result, message) and, for each id, makes the bad call that CALLS maps it to,
then checks the exception type and that the message contains the documented text (or, for the SDPA
drop-in's fallbacks, the warning and what torch does next). A row without a call, or a call without a
row, fails too, so the two cannot drift apart. Rows whose device is ``cuda`` skip without a GPU that
runs flashattn's kernels.

``PYTHONPATH=. python tests/test_error_table.py`` prints what each call does now, to help edit the table.
"""
from __future__ import annotations

import builtins
import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List

import pytest
import torch

import flashattn
from flashattn import sdpa as fa_sdpa

from conftest import CUDA_SKIP_REASON

DOC = Path(__file__).resolve().parents[1] / "docs" / "errors.md"
COLUMNS = ["id", "API", "misuse", "device", "result", "message"]


@dataclass(frozen=True)
class Row:
    id: str
    api: str
    misuse: str
    device: str
    result: str
    message: str

    @property
    def outcome(self):
        """(warning class name or None, exception class name or None) from the result cell."""
        names = re.findall(r"\b[A-Za-z]+(?:Error|Warning)\b", self.result)
        if names and names[0] == "UserWarning":
            return "UserWarning", (names[1] if len(names) > 1 else None)
        return None, (names[0] if names else None)


def _cells(line: str) -> List[str]:
    cells = [c.strip() for c in line.strip().strip("|").replace("\\|", "\0").split("|")]
    return [c.replace("\0", "|") for c in cells]


def _unquote(cell: str) -> str:
    return cell[1:-1] if len(cell) >= 2 and cell.startswith("`") and cell.endswith("`") else cell


def parse_rows(text: str) -> List[Row]:
    """The rows of every markdown table in ``text`` whose header is exactly COLUMNS."""
    rows, in_table = [], False
    for line in text.splitlines():
        if not line.startswith("|"):
            in_table = False
            continue
        cells = _cells(line)
        if cells == COLUMNS:
            in_table = True
            continue
        if not in_table or set("".join(cells)) <= set("-: "):
            continue
        assert len(cells) == len(COLUMNS), f"docs/errors.md: row with {len(cells)} cells: {line}"
        rows.append(Row(*[_unquote(c) for c in cells]))
    return rows


# --------------------------------------------------------------------------------------------------
# The bad calls, by id
# --------------------------------------------------------------------------------------------------


def _randn(*shape, dtype=torch.float32, device="cpu"):
    return torch.randn(*shape, dtype=dtype, device=device)


def _bhsd(dtype=torch.float32, device="cpu"):
    """SDPA layout: q (2, 4, 5, 8), k and v (2, 4, 7, 8)."""
    return _randn(2, 4, 5, 8, dtype=dtype, device=device), _randn(2, 4, 7, 8, dtype=dtype, device=device), \
        _randn(2, 4, 7, 8, dtype=dtype, device=device)


def _bshd(dtype=torch.float32, device="cpu"):
    """FlashAttention-2 layout: q (2, 5, 4, 8), k and v (2, 7, 2, 8)."""
    return _randn(2, 5, 4, 8, dtype=dtype, device=device), _randn(2, 7, 2, 8, dtype=dtype, device=device), \
        _randn(2, 7, 2, 8, dtype=dtype, device=device)


def _strided_last_dim(*shape, dtype=torch.float32):
    return _randn(*shape[:-1], 2 * shape[-1], dtype=dtype)[..., ::2]


def sdpa(*args, **kwargs):
    return flashattn.scaled_dot_product_attention(*args, **kwargs)


def fa2(*args, **kwargs):
    return flashattn.flash_attn_func(*args, **kwargs)


def kvpacked(q, k, v, **kwargs):
    return flashattn.flash_attn_kvpacked_func(q, torch.stack([k, v], dim=2), **kwargs)


def qkvpacked(**kwargs):
    return flashattn.flash_attn_qkvpacked_func(_randn(2, 5, 3, 4, 8), **kwargs)


def _cu(offsets, device="cpu"):
    return torch.tensor(offsets, dtype=torch.int32, device=device)


def varlen(**replace):
    """flash_attn_varlen_func on valid packed arguments (two sequences), with some replaced."""
    args = dict(q=_randn(10, 4, 8), k=_randn(12, 2, 8), v=_randn(12, 2, 8), cu_seqlens_q=_cu([0, 4, 10]),
                cu_seqlens_k=_cu([0, 5, 12]), max_seqlen_q=6, max_seqlen_k=7)
    args.update(replace)
    return flashattn.flash_attn_varlen_func(**args)


def kvcache(**replace):
    """flash_attn_with_kvcache on valid arguments (2 sequences, a 10-row cache), with some replaced."""
    args = dict(q=_randn(2, 1, 4, 8), k_cache=_randn(2, 10, 4, 8), v_cache=_randn(2, 10, 4, 8))
    args.update(replace)
    return flashattn.flash_attn_with_kvcache(**args)


def fwd(q, k, v, scale=0.35, is_causal=False, bottom_right=False, attn_mask=None, dropout_p=0.0, rng_state=None,
        **keywords):
    return torch.ops.flashattn.fwd(q, k, v, scale, is_causal, bottom_right, attn_mask, dropout_p, rng_state,
                                   **keywords)


def bwd(**replace):
    """torch.ops.flashattn.bwd on valid arguments from a forward, with some replaced."""
    q, k, v = _bshd()
    out, lse = fwd(q, k, v)
    args = dict(dout=torch.randn_like(out), q=q, k=k, v=v, out=out, lse=lse, attn_mask=None, dmask=None,
                dropout_p=0.0, rng_state=None)
    args.update({name: make(args) for name, make in replace.items()})
    return torch.ops.flashattn.bwd(args["dout"], args["q"], args["k"], args["v"], args["out"], args["lse"],
                                   0.35, False, False, False, args["attn_mask"], args["dmask"], args["dropout_p"],
                                   args["rng_state"])


def keep_mask(rng_state=None, batch=2, heads=4, seqlen_q=5, seqlen_k=7, dropout_p=0.1):
    rng_state = torch.tensor([1, 2]) if rng_state is None else rng_state
    return torch.ops.flashattn.dropout_keep_mask(rng_state, batch, heads, seqlen_q, seqlen_k, dropout_p)


def _cpu_q_cuda_kv(layout):
    q, k, v = layout(torch.float16)
    return q, k.cuda(), v.cuda()


def _no_cuda_kernels(mp):
    mp.setattr(flashattn.ops, "cuda_kernels_built", lambda: False)


def _old_gpu(mp):
    mp.setitem(fa_sdpa._capability_cache, torch.cuda.current_device(), (7, 5))


_UNIMPLEMENTED = {
    "alibi-softcap": {"alibi_slopes": torch.ones(4), "softcap": 30.0},
}

# id -> call(monkeypatch). Each makes one bad call; the table says what must happen.
CALLS: Dict[str, Callable] = {
    # scaled_dot_product_attention: errors
    "sdpa-not-a-tensor": lambda mp: sdpa(_bhsd()[0].tolist(), *_bhsd()[1:]),
    "sdpa-heads-mismatch": lambda mp: sdpa(_randn(2, 8, 5, 8), _randn(2, 2, 7, 8), _randn(2, 2, 7, 8)),
    "sdpa-kv-heads-mismatch": lambda mp: sdpa(_randn(2, 4, 5, 8), _randn(2, 2, 7, 8), _randn(2, 4, 7, 8)),
    "sdpa-gqa-not-a-multiple": lambda mp: sdpa(_randn(2, 6, 5, 8), _randn(2, 4, 7, 8), _randn(2, 4, 7, 8),
                                               enable_gqa=True),
    "sdpa-gqa-kv-heads-mismatch": lambda mp: sdpa(_randn(2, 4, 5, 8), _randn(2, 2, 7, 8), _randn(2, 4, 7, 8),
                                                  enable_gqa=True),
    "sdpa-kv-seqlen-mismatch": lambda mp: sdpa(_randn(2, 4, 5, 8), _randn(2, 4, 7, 8), _randn(2, 4, 3, 8)),
    "sdpa-key-head-dim": lambda mp: sdpa(_randn(2, 4, 5, 8), _randn(2, 4, 7, 16), _randn(2, 4, 7, 8)),
    "sdpa-dtype-mismatch": lambda mp: sdpa(_randn(2, 4, 5, 8), _randn(2, 4, 7, 8, dtype=torch.float64),
                                           _randn(2, 4, 7, 8)),
    "sdpa-mixed-devices": lambda mp: sdpa(*_cpu_q_cuda_kv(_bhsd)),
    # scaled_dot_product_attention: fallbacks to torch
    "sdpa-attn-mask-and-causal": lambda mp: sdpa(*_bhsd(), attn_mask=torch.rand(5, 7) > 0.3, is_causal=True),
    "sdpa-attn-mask-shape": lambda mp: sdpa(*_bhsd(), attn_mask=torch.rand(5, 6) > 0.3),
    "sdpa-attn-mask-float64": lambda mp: sdpa(*_bhsd(), attn_mask=torch.zeros(5, 7, dtype=torch.float64)),
    "sdpa-dropout-one": lambda mp: sdpa(*_bhsd(), dropout_p=1.0),
    "sdpa-head-dim-300": lambda mp: sdpa(_randn(2, 4, 5, 300), _randn(2, 4, 7, 300), _randn(2, 4, 7, 300)),
    "sdpa-head-dim-0": lambda mp: sdpa(_randn(2, 4, 5, 0), _randn(2, 4, 7, 0), _randn(2, 4, 7, 0)),
    "sdpa-batch-broadcast": lambda mp: sdpa(_randn(2, 4, 5, 8), _randn(1, 4, 7, 8), _randn(1, 4, 7, 8)),
    "sdpa-rank-broadcast": lambda mp: sdpa(_randn(2, 4, 5, 8), _randn(4, 7, 8), _randn(4, 7, 8)),
    "sdpa-query-head-broadcast": lambda mp: sdpa(_randn(2, 1, 5, 8), _randn(2, 4, 7, 8), _randn(2, 4, 7, 8)),
    "sdpa-one-dim": lambda mp: sdpa(_randn(8), _randn(8), _randn(8)),
    "sdpa-integer": lambda mp: sdpa(*(t.long() for t in _bhsd())),
    "sdpa-nested": lambda mp: sdpa(*(torch.nested.nested_tensor([_randn(4, 5, 8), _randn(4, 3, 8)]) for _ in range(3))),
    "sdpa-meta": lambda mp: sdpa(*(t.to("meta") for t in _bhsd())),
    "sdpa-cuda-float32": lambda mp: sdpa(*_bhsd(device="cuda")),
    "sdpa-cuda-no-kernels": lambda mp: (_no_cuda_kernels(mp), sdpa(*_bhsd(torch.float16, device="cuda")))[1],
    "sdpa-cuda-old-gpu": lambda mp: (_old_gpu(mp), sdpa(*_bhsd(torch.float16, device="cuda")))[1],
    # flash_attn_func
    "fa2-sink-shape": lambda mp: fa2(*_bshd(), learnable_sink=_randn(3)),
    "fa2-sink-device": lambda mp: fa2(*_bshd(), learnable_sink=_randn(4, device="cuda")),
    "fa2-not-a-tensor": lambda mp: fa2(*_bshd()[:2], _bshd()[2].tolist()),
    "fa2-q-3-dims": lambda mp: fa2(_randn(5, 4, 8), *_bshd()[1:]),
    "fa2-k-5-dims": lambda mp: fa2(_bshd()[0], _randn(2, 7, 2, 8, 1), _bshd()[2]),
    "fa2-strided-last-dim": lambda mp: fa2(*_bshd()[:2], _strided_last_dim(2, 7, 2, 8)),
    "fa2-dtype-mismatch": lambda mp: fa2(_randn(2, 5, 4, 8), _randn(2, 7, 2, 8, dtype=torch.float64),
                                         _randn(2, 7, 2, 8)),
    "fa2-integer": lambda mp: fa2(*(t.long() for t in _bshd())),
    "fa2-batch-mismatch": lambda mp: fa2(_randn(2, 5, 4, 8), _randn(1, 7, 2, 8), _randn(1, 7, 2, 8)),
    "fa2-kv-seqlen-mismatch": lambda mp: fa2(_randn(2, 5, 4, 8), _randn(2, 7, 2, 8), _randn(2, 3, 2, 8)),
    "fa2-kv-heads-mismatch": lambda mp: fa2(_randn(2, 5, 4, 8), _randn(2, 7, 2, 8), _randn(2, 7, 1, 8)),
    "fa2-heads-not-a-multiple": lambda mp: fa2(_randn(2, 5, 3, 8), _randn(2, 7, 2, 8), _randn(2, 7, 2, 8)),
    "fa2-no-kv-heads": lambda mp: fa2(_randn(2, 5, 4, 8), _randn(2, 7, 0, 8), _randn(2, 7, 0, 8)),
    "fa2-head-dim-mismatch": lambda mp: fa2(_randn(2, 5, 4, 8), _randn(2, 7, 2, 16), _randn(2, 7, 2, 16)),
    "fa2-head-dim-300": lambda mp: fa2(_randn(2, 5, 4, 300), _randn(2, 7, 2, 300), _randn(2, 7, 2, 300)),
    "fa2-head-dim-0": lambda mp: fa2(_randn(2, 5, 4, 0), _randn(2, 7, 2, 0), _randn(2, 7, 2, 0)),
    "fa2-mixed-devices": lambda mp: fa2(*_cpu_q_cuda_kv(_bshd)),
    "fa2-cuda-float32": lambda mp: fa2(*_bshd(device="cuda")),
    "fa2-cuda-no-kernels": lambda mp: (_no_cuda_kernels(mp), fa2(*_bshd(torch.float16, device="cuda")))[1],
    # flash_attn_kvpacked_func
    "kvpacked-q-not-a-tensor": lambda mp: flashattn.flash_attn_kvpacked_func(None, _randn(2, 7, 2, 2, 8)),
    "kvpacked-kv-4-dims": lambda mp: flashattn.flash_attn_kvpacked_func(_randn(2, 5, 4, 8), _randn(2, 7, 2, 8)),
    "kvpacked-kv-pack-of-3": lambda mp: flashattn.flash_attn_kvpacked_func(_randn(2, 5, 4, 8), _randn(2, 7, 3, 2, 8)),
    "kvpacked-strided-last-dim": lambda mp: flashattn.flash_attn_kvpacked_func(
        _randn(2, 5, 4, 8), _strided_last_dim(2, 7, 2, 2, 8)),
    "kvpacked-heads-not-a-multiple": lambda mp: kvpacked(_randn(2, 5, 3, 8), *_bshd()[1:]),
    # flash_attn_qkvpacked_func
    "qkvpacked-not-a-tensor": lambda mp: flashattn.flash_attn_qkvpacked_func(_randn(2, 5, 3, 4, 8).numpy()),
    "qkvpacked-4-dims": lambda mp: flashattn.flash_attn_qkvpacked_func(_randn(2, 5, 4, 8)),
    "qkvpacked-pack-of-2": lambda mp: flashattn.flash_attn_qkvpacked_func(_randn(2, 5, 2, 4, 8)),
    "qkvpacked-strided-last-dim": lambda mp: flashattn.flash_attn_qkvpacked_func(_strided_last_dim(2, 5, 3, 4, 8)),
    "qkvpacked-integer": lambda mp: flashattn.flash_attn_qkvpacked_func(_randn(2, 5, 3, 4, 8).long()),
    # flash_attn_varlen_func
    "varlen-window-not-a-pair": lambda mp: varlen(window_size=8),
    "varlen-block-table-packed-k": lambda mp: varlen(block_table=torch.zeros(2, 1, dtype=torch.int32)),
    "varlen-q-4-dims": lambda mp: varlen(q=_randn(2, 5, 4, 8)),
    "varlen-cu-not-a-tensor": lambda mp: varlen(cu_seqlens_q=[0, 4, 10]),
    "varlen-cu-int64": lambda mp: varlen(cu_seqlens_q=torch.tensor([0, 4, 10])),
    "varlen-cu-2-dims": lambda mp: varlen(cu_seqlens_k=_cu([0, 5, 12])[None]),
    "varlen-cu-lengths-differ": lambda mp: varlen(cu_seqlens_k=_cu([0, 12])),
    "varlen-cu-on-the-cpu": lambda mp: varlen(**{name: _randn(*shape, dtype=torch.float16, device="cuda")
                                                 for name, shape in (("q", (10, 4, 8)), ("k", (12, 2, 8)),
                                                                     ("v", (12, 2, 8)))},
                                              cu_seqlens_k=_cu([0, 5, 12], "cuda")),
    "varlen-max-seqlen-negative": lambda mp: varlen(max_seqlen_k=-1),
    "varlen-sequence-too-long": lambda mp: varlen(max_seqlen_q=5),
    "varlen-offsets-short": lambda mp: varlen(cu_seqlens_q=_cu([0, 4, 9])),
    "varlen-heads-not-a-multiple": lambda mp: varlen(q=_randn(10, 3, 8)),
    "varlen-seqused-too-long": lambda mp: varlen(seqused_q=_cu([5, 6])),
    "varlen-seqused-padded-path": lambda mp: varlen(seqused_k=_cu([5, 7]), dropout_p=0.1),
    # flash_attn_with_kvcache
    "kvcache-rotary-without-sin": lambda mp: kvcache(k=_randn(2, 3, 4, 8), v=_randn(2, 3, 4, 8),
                                                     cache_seqlens=_cu([2, 7]), rotary_cos=torch.ones(10, 4)),
    "kvcache-rotary-without-new-kv": lambda mp: kvcache(rotary_cos=torch.ones(10, 4), rotary_sin=torch.ones(10, 4)),
    "kvcache-rotary-past-the-table": lambda mp: kvcache(k=_randn(2, 3, 4, 8), v=_randn(2, 3, 4, 8),
                                                        cache_seqlens=_cu([2, 7]), rotary_cos=torch.ones(5, 4),
                                                        rotary_sin=torch.ones(5, 4)),
    "kvcache-batch-idx-range": lambda mp: kvcache(cache_seqlens=_cu([2, 7]), cache_batch_idx=_cu([0, 2])),
    "kvcache-leftpad-range": lambda mp: kvcache(cache_seqlens=_cu([2, 7]), cache_leftpad=_cu([3, 0])),
    "kvcache-block-table-shape": lambda mp: kvcache(block_table=_cu([0, 1])),
    "kvcache-block-table-with-batch-idx": lambda mp: kvcache(block_table=_cu([[0], [1]]), cache_batch_idx=_cu([0, 1])),
    "kvcache-num-splits": lambda mp: kvcache(num_splits=-1),
    "kvcache-k-without-v": lambda mp: kvcache(k=_randn(2, 3, 4, 8), cache_seqlens=_cu([2, 7])),
    "kvcache-append-without-lengths": lambda mp: kvcache(k=_randn(2, 3, 4, 8), v=_randn(2, 3, 4, 8)),
    "kvcache-lengths-shape": lambda mp: kvcache(cache_seqlens=_cu([[2, 7]])),
    "kvcache-int-length-too-long": lambda mp: kvcache(cache_seqlens=11),
    "kvcache-cache-shapes-differ": lambda mp: kvcache(v_cache=_randn(2, 9, 4, 8)),
    "kvcache-new-dtype": lambda mp: kvcache(k=_randn(2, 3, 4, 8, dtype=torch.float64),
                                            v=_randn(2, 3, 4, 8, dtype=torch.float64), cache_seqlens=_cu([2, 7])),
    "kvcache-append-past-the-end": lambda mp: kvcache(k=_randn(2, 3, 4, 8), v=_randn(2, 3, 4, 8),
                                                      cache_seqlens=_cu([3, 8])),
    # torch.ops.flashattn.fwd
    "fwd-q-3-dims": lambda mp: fwd(_randn(5, 4, 8), *_bshd()[1:]),
    "fwd-strided-last-dim": lambda mp: fwd(_strided_last_dim(2, 5, 4, 8), *_bshd()[1:]),
    "fwd-dtype-mismatch": lambda mp: fwd(_randn(2, 5, 4, 8), _randn(2, 7, 2, 8, dtype=torch.float16), _randn(2, 7, 2, 8)),
    "fwd-integer": lambda mp: fwd(*(t.int() for t in _bshd())),
    "fwd-batch-mismatch": lambda mp: fwd(_randn(2, 5, 4, 8), _randn(1, 7, 2, 8), _randn(1, 7, 2, 8)),
    "fwd-kv-seqlen-mismatch": lambda mp: fwd(_randn(2, 5, 4, 8), _randn(2, 7, 2, 8), _randn(2, 3, 2, 8)),
    "fwd-kv-heads-mismatch": lambda mp: fwd(_randn(2, 5, 4, 8), _randn(2, 7, 2, 8), _randn(2, 7, 1, 8)),
    "fwd-heads-not-a-multiple": lambda mp: fwd(_randn(2, 5, 3, 8), _randn(2, 7, 2, 8), _randn(2, 7, 2, 8)),
    "fwd-no-kv-heads": lambda mp: fwd(_randn(2, 5, 4, 8), _randn(2, 7, 0, 8), _randn(2, 7, 0, 8)),
    "fwd-head-dim-mismatch": lambda mp: fwd(_randn(2, 5, 4, 8), _randn(2, 7, 2, 8), _randn(2, 7, 2, 4)),
    "fwd-head-dim-300": lambda mp: fwd(_randn(2, 5, 4, 300), _randn(2, 7, 2, 300), _randn(2, 7, 2, 300)),
    "fwd-scale-not-a-number": lambda mp: fwd(*_bshd(), scale="0.1"),
    "fwd-missing-argument": lambda mp: torch.ops.flashattn.fwd(*_bshd(), 0.35, False),
    "fwd-mixed-devices": lambda mp: fwd(*_cpu_q_cuda_kv(_bshd)),
    "fwd-cuda-float32": lambda mp: fwd(*_bshd(device="cuda")),
    "fwd-mask-shape": lambda mp: fwd(*_bshd(), attn_mask=torch.ones(2, 4, 5, 6, dtype=torch.bool)),
    "fwd-mask-dtype": lambda mp: fwd(*_bshd(), attn_mask=torch.ones(2, 4, 5, 7, dtype=torch.int32)),
    "fwd-dropout-without-rng-state": lambda mp: fwd(*_bshd(), dropout_p=0.1),
    "fwd-dropout-negative": lambda mp: fwd(*_bshd(), dropout_p=-0.1, rng_state=torch.tensor([1, 2])),
    "fwd-rng-state-dtype": lambda mp: fwd(*_bshd(), dropout_p=0.1, rng_state=torch.tensor([1, 2], dtype=torch.int32)),
    "fwd-rng-state-shape": lambda mp: fwd(*_bshd(), dropout_p=0.1, rng_state=torch.tensor([1, 2, 3])),
    "fwd-alibi-shape": lambda mp: fwd(*_bshd(), alibi_slopes=_randn(3)),
    "fwd-alibi-dtype": lambda mp: fwd(*_bshd(), alibi_slopes=_randn(4, dtype=torch.float64)),
    "fwd-alibi-softcap": lambda mp: fwd(*_bshd(), softcap=30.0, alibi_slopes=_randn(4)),
    "fwd-alibi-mask": lambda mp: fwd(*_bshd(), attn_mask=torch.ones(2, 4, 5, 7, dtype=torch.bool),
                                     alibi_slopes=_randn(4)),
    # torch.ops.flashattn.bwd
    "bwd-dout-shape": lambda mp: bwd(dout=lambda a: a["dout"][:, :, :2]),
    "bwd-out-shape": lambda mp: bwd(out=lambda a: a["out"][:, :3]),
    "bwd-dout-dtype": lambda mp: bwd(dout=lambda a: a["dout"].double()),
    "bwd-dout-strided-last-dim": lambda mp: bwd(dout=lambda a: _strided_last_dim(2, 5, 4, 8)),
    "bwd-out-strided-last-dim": lambda mp: bwd(out=lambda a: _strided_last_dim(2, 5, 4, 8)),
    "bwd-lse-shape": lambda mp: bwd(lse=lambda a: a["lse"][:, :1]),
    "bwd-lse-dtype": lambda mp: bwd(lse=lambda a: a["lse"].half()),
    "bwd-heads-not-a-multiple": lambda mp: bwd(q=lambda a: a["q"][:, :, :3], dout=lambda a: a["dout"][:, :, :3],
                                               out=lambda a: a["out"][:, :, :3], lse=lambda a: a["lse"][:, :3]),
    "bwd-lse-device": lambda mp: _bwd_lse_on_cpu(),
    "bwd-dmask-without-mask": lambda mp: bwd(dmask=lambda a: torch.zeros(2, 4, 5, 7)),
    "bwd-dmask-bool-mask": lambda mp: bwd(attn_mask=lambda a: torch.ones(2, 4, 5, 7, dtype=torch.bool),
                                          dmask=lambda a: torch.zeros(2, 4, 5, 7)),
    "bwd-dmask-shape": lambda mp: bwd(attn_mask=lambda a: torch.zeros(2, 4, 5, 7), dmask=lambda a: torch.zeros(2, 4, 5, 6)),
    "bwd-dropout-without-rng-state": lambda mp: bwd(dropout_p=lambda a: 0.1),
    # torch.ops.flashattn.dropout_keep_mask
    "keep-mask-negative-size": lambda mp: keep_mask(seqlen_q=-1),
    "keep-mask-dropout-one": lambda mp: keep_mask(dropout_p=1.0),
    "keep-mask-rng-state-dtype": lambda mp: keep_mask(rng_state=torch.tensor([1.0, 2.0])),
}


def _bwd_lse_on_cpu():
    q, k, v = (t.cuda() for t in _bshd(torch.float16))
    out, lse = fwd(q, k, v)
    return torch.ops.flashattn.bwd(torch.randn_like(out), q, k, v, out, lse.cpu(), 0.35, False, False)


# Implemented, but out of range: the op raises.
_OUT_OF_RANGE = {
    "dropout-one": {"dropout_p": 1.0},
    "softcap-negative": {"softcap": -1.0},
    "window-not-a-pair": {"window_size": 8},
    "alibi-shape": {"alibi_slopes": torch.ones(3)},
}

for _name, _kwargs in {**_UNIMPLEMENTED, **_OUT_OF_RANGE}.items():
    CALLS[f"fa2-{_name}"] = lambda mp, kw=_kwargs: fa2(*_bshd(), **kw)
    CALLS[f"kvpacked-{_name}"] = lambda mp, kw=_kwargs: kvpacked(*_bshd(), **kw)
    CALLS[f"qkvpacked-{_name}"] = lambda mp, kw=_kwargs: qkvpacked(**kw)


# --------------------------------------------------------------------------------------------------
# The tests
# --------------------------------------------------------------------------------------------------

ROWS = parse_rows(DOC.read_text()) if DOC.exists() else []
API_NAMES = {
    "scaled_dot_product_attention", "flash_attn_func", "flash_attn_kvpacked_func", "flash_attn_qkvpacked_func",
    "flash_attn_varlen_func", "flash_attn_with_kvcache", "torch.ops.flashattn.fwd", "torch.ops.flashattn.bwd", "torch.ops.flashattn.dropout_keep_mask",
}


def test_table_and_calls_match():
    assert ROWS, f"no table with columns {COLUMNS} in {DOC}"
    ids = [row.id for row in ROWS]
    assert len(ids) == len(set(ids)), f"duplicate ids in docs/errors.md: {sorted(i for i in ids if ids.count(i) > 1)}"
    assert sorted(set(ids) - set(CALLS)) == [], "rows in docs/errors.md without a call in this test"
    assert sorted(set(CALLS) - set(ids)) == [], "calls in this test without a row in docs/errors.md"
    for row in ROWS:
        assert row.api in API_NAMES, f"{row.id}: unknown API {row.api!r}"
        assert row.device in ("cpu", "cuda"), f"{row.id}: device must be cpu or cuda, got {row.device!r}"
        assert row.message and row.misuse, f"{row.id}: empty misuse or message"
        warning, error = row.outcome
        assert warning or error, f"{row.id}: the result cell names no exception or warning: {row.result!r}"
        for name in filter(None, (warning, error)):
            assert isinstance(getattr(builtins, name, None), type), f"{row.id}: {name} is not a builtin exception"


@pytest.fixture
def fresh_fallback_warnings():
    fa_sdpa._warned_reasons.clear()
    yield
    fa_sdpa._warned_reasons.clear()


@pytest.mark.parametrize("row", ROWS, ids=[row.id for row in ROWS])
def test_row(row, monkeypatch, fresh_fallback_warnings):
    if row.device == "cuda" and CUDA_SKIP_REASON is not None:
        pytest.skip(CUDA_SKIP_REASON)
    if row.id not in CALLS:
        pytest.fail(f"docs/errors.md row {row.id!r} has no call in tests/test_error_table.py CALLS")
    call = CALLS[row.id]
    warning, error = row.outcome
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if error is not None:
            with pytest.raises(getattr(builtins, error)) as excinfo:
                call(monkeypatch)
            # Exactly this type, not a subclass that happens to match (NotImplementedError is a RuntimeError).
            assert type(excinfo.value).__name__ == error, f"raised {type(excinfo.value).__name__}: {excinfo.value}"
        else:
            result = call(monkeypatch)
            assert isinstance(result, torch.Tensor)
    fallbacks = [str(w.message) for w in caught if "falling back to torch SDPA" in str(w.message)]
    if warning is None:
        assert not fallbacks, f"unexpected fallback: {fallbacks}"
        assert row.message in str(excinfo.value), f"message: {excinfo.value}"
    else:
        assert any(row.message in text for text in fallbacks), f"fallback warnings: {fallbacks}"


def _describe(call) -> str:
    """What a call does now, as the result and message cells of a table row."""
    fa_sdpa._warned_reasons.clear()
    mp = pytest.MonkeyPatch()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                call(mp)
                error = None
            except Exception as exc:  # noqa: BLE001  (reporting whatever happens)
                error = exc
    finally:
        mp.undo()
    fallbacks = [str(w.message) for w in caught if "falling back" in str(w.message)]
    if fallbacks:
        then = f"then torch raises `{type(error).__name__}`" if error else "then torch's result"
        return f"`UserWarning`, {then} | `{fallbacks[0]}`"
    if error is None:
        return "no error | "
    return f"`{type(error).__name__}` | `{str(error).splitlines()[0]}`"


if __name__ == "__main__":
    torch.manual_seed(0)
    for case_id, case_call in CALLS.items():
        try:
            print(f"| `{case_id}` | {_describe(case_call)} |")
        except Exception as exc:  # noqa: BLE001  (e.g. CUDA rows without a GPU)
            print(f"| `{case_id}` | cannot run here: {type(exc).__name__}: {str(exc).splitlines()[0][:80]} |")
