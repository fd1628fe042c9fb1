#!/usr/bin/env python
"""Train a tiny Llama-style model on packed documents with attn_implementation="fattn", beside a reference.

Each step packs random documents (random lengths) into one row with position_ids restarting at 0 per
document: "fattn" runs them through flash_attn_varlen_func (memory linear in tokens). The reference is
the same model (same initial weights, same batches, same optimizer) with "sdpa", which transformers
gives a per-document block-diagonal S x S mask for packed position_ids. Prints both loss curves, the
largest difference, and the peak memory of each run (CUDA: torch.cuda.max_memory_allocated; CPU: not
measured, printed as n/a).

    python scripts/train_packed_llama.py --device cpu --steps 20
    python scripts/train_packed_llama.py --device cuda --dtype bfloat16 --tokens 8192 --steps 20
"""
from __future__ import annotations

import argparse
import copy
import pathlib
import sys

import torch

# Run from a checkout: the repository root (with the built extension) ahead of any installed flashattn.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                   help="model dtype (flashattn's CUDA kernels want bfloat16; the CPU serves float32)")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--tokens", type=int, default=256, help="packed tokens per step")
    p.add_argument("--max-doc", type=int, default=64, help="longest document")
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--vocab", type=int, default=128)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.steps < 1 or args.tokens < 2 or args.max_doc < 1:
        p.error("--steps >= 1, --tokens >= 2 and --max-doc >= 1 are needed")
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: no CUDA device")
    return args


def make_batches(args):
    """[(input_ids (1, T), position_ids (1, T), labels (1, T))] per step: counting documents of random lengths in
    [1, max_doc] packed into T = --tokens tokens; labels -100 at each document's first token (no
    prediction across a boundary: transformers' loss shifts labels by one)."""
    gen = torch.Generator().manual_seed(args.seed)
    batches = []
    for _ in range(args.steps):
        lengths, left = [], args.tokens
        while left > 0:
            n = min(int(torch.randint(1, args.max_doc + 1, (1,), generator=gen)), left)
            lengths.append(n)
            left -= n
        # Each document counts up by one from a random token (mod the vocabulary): learnable within a
        # document, unpredictable across a boundary.
        starts = torch.randint(0, args.vocab - 1, (len(lengths),), generator=gen)
        ids = torch.cat([(s + torch.arange(n)) % (args.vocab - 1) + 1 for s, n in zip(starts.tolist(), lengths)])[None]
        pos = torch.cat([torch.arange(n) for n in lengths])[None]
        labels = ids.clone()
        labels[pos == 0] = -100
        batches.append((ids, pos, labels))
    return batches


def train(model, batches, args):
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    device = torch.device(args.device)
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    losses = []
    model.train()
    for ids, pos, labels in batches:
        out = model(ids.to(device), position_ids=pos.to(device), labels=labels.to(device), use_cache=False)
        out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(out.loss.detach()))
    peak = torch.cuda.max_memory_allocated() if device.type == "cuda" else None
    return losses, peak


def main(argv=None):
    args = parse_args(argv)
    import transformers

    import flashattn.integrations.transformers as fa_hf  # registers "fattn"

    config = transformers.LlamaConfig(hidden_size=args.hidden, intermediate_size=2 * args.hidden,
                                      num_hidden_layers=args.layers, num_attention_heads=args.heads,
                                      num_key_value_heads=args.kv_heads, vocab_size=args.vocab,
                                      max_position_embeddings=max(args.max_doc, 16), pad_token_id=0)
    dtype = getattr(torch, args.dtype)
    torch.manual_seed(args.seed)
    ref = transformers.AutoModelForCausalLM.from_config(copy.deepcopy(config), attn_implementation="sdpa")
    ours = transformers.AutoModelForCausalLM.from_config(copy.deepcopy(config), attn_implementation=fa_hf.ATTN_IMPLEMENTATION)
    ours.load_state_dict(ref.state_dict())
    ref, ours = (m.to(device=args.device, dtype=dtype) for m in (ref, ours))
    batches = make_batches(args)

    fa_hf.path_counts.clear()
    ours_losses, ours_peak = train(ours, batches, args)
    paths = dict(fa_hf.path_counts)
    ref_losses, ref_peak = train(ref, batches, args)

    print(f"packed training: {args.steps} steps x {args.tokens} tokens, device {args.device}, {args.dtype}")
    print(f"fattn attention paths: {paths}")
    print(f"{'step':>4}  {'fattn':>10}  {'sdpa (block mask)':>18}")
    for i, (a, b) in enumerate(zip(ours_losses, ref_losses)):
        print(f"{i:>4}  {a:>10.5f}  {b:>18.5f}")
    diff = max(abs(a - b) for a, b in zip(ours_losses, ref_losses))
    print(f"largest loss difference: {diff:.3g}")

    def fmt(peak):
        return "n/a (CPU)" if peak is None else f"{peak / 2**20:.1f} MiB"

    print(f"peak memory: fattn {fmt(ours_peak)}, sdpa {fmt(ref_peak)}")
    return ours_losses, ref_losses, paths


if __name__ == "__main__":
    main()
    sys.exit(0)
