#!/usr/bin/python3
"""Trains the tiny Llama-style model (examples/python/tiny_llama.py) on its synthetic corpus.

    /usr/bin/python3 scripts/train_tiny_llama.py [--out tests/data/tiny_llama] [--steps N]

Seeded (torch.manual_seed, numpy Generator, torch.set_num_threads(1)), CPU only,
no download. The corpus (tiny_llama.synthetic_batch) is sequences of copy
(induction), counting and periodic segments, context 256. Writes
OUT/model.safetensors (float32, Hugging Face Llama parameter names, written by
tiny_llama.save_safetensors), OUT/config.json, OUT/tokens.npy and
OUT/positions.npy (held-out example tokens and their explicit positions, shared
by the Python and LibTorch captures in tests/python/model/), and
OUT/training.json (the loss curve and the final held-out loss).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples", "python"))
import tiny_llama as tl  # noqa: E402

TRAIN_SEED, HELDOUT_SEED, EXAMPLE_SEED = 1234, 999, 2025


def heldout_loss(model, cfg, batches=8, batch=16) -> float:
    rng = np.random.default_rng(HELDOUT_SEED)
    total, count = 0.0, 0
    with torch.no_grad():
        for _ in range(batches):
            tok = torch.from_numpy(tl.synthetic_batch(rng, batch, cfg.context_length, cfg.vocab_size))
            pos = torch.arange(cfg.context_length).expand_as(tok)
            logits = model(tok[:, :-1], pos[:, :-1])
            total += F.cross_entropy(logits.reshape(-1, cfg.vocab_size), tok[:, 1:].reshape(-1), reduction="sum").item()
            count += tok[:, 1:].numel()
    return total / count


def example_tokens(cfg):
    """4 held-out sequences of 192 tokens; positions start at 0, 0, 17 and 64 (explicit, not arange)."""
    rng = np.random.default_rng(EXAMPLE_SEED)
    tokens = tl.synthetic_batch(rng, 4, 192, cfg.vocab_size)
    positions = np.stack([off + np.arange(192, dtype=np.int64) for off in (0, 0, 17, 64)])
    return tokens, positions


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data", "tiny_llama"))
    ap.add_argument("--steps", type=int, default=500)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--lr", type=float, default=4e-3)
    args = ap.parse_args()

    torch.manual_seed(TRAIN_SEED)
    torch.set_num_threads(1)
    cfg = tl.TinyLlamaConfig()
    model = tl.TinyLlama(cfg)
    model.init_weights(torch.Generator().manual_seed(TRAIN_SEED))
    untrained = heldout_loss(model, cfg)
    print(f"untrained held-out loss {untrained:.4f} (log vocab = {math.log(cfg.vocab_size):.4f})", flush=True)

    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.0)
    warmup = max(1, args.steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warmup) * (0.1 + 0.45 * (1 + math.cos(math.pi * min(1.0, s / args.steps)))))
    rng = np.random.default_rng(TRAIN_SEED)
    pos = torch.arange(cfg.context_length).expand(args.batch, -1)
    curve, t0, running = [], time.time(), None
    for step in range(1, args.steps + 1):
        tok = torch.from_numpy(tl.synthetic_batch(rng, args.batch, cfg.context_length, cfg.vocab_size))
        logits = model(tok[:, :-1], pos[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, cfg.vocab_size), tok[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        running = loss.item() if running is None else 0.9 * running + 0.1 * loss.item()
        if step % 25 == 0 or step == 1:
            curve.append([step, round(loss.item(), 4)])
            print(f"step {step:4d}  loss {loss.item():.4f}  (smoothed {running:.4f})  {time.time() - t0:6.1f} s", flush=True)

    model.eval()
    final = heldout_loss(model, cfg)
    wall = time.time() - t0
    print(f"final held-out loss {final:.4f} (untrained {untrained:.4f}); training wall time {wall:.0f} s", flush=True)

    os.makedirs(args.out, exist_ok=True)
    weights = {k: v.detach().contiguous().numpy() for k, v in model.state_dict().items()}
    tl.save_safetensors(os.path.join(args.out, "model.safetensors"), weights, {"format": "pt"})
    with open(os.path.join(args.out, "config.json"), "w", encoding="utf-8") as f:
        json.dump(cfg.to_dict(), f, indent=1)
        f.write("\n")
    tokens, positions = example_tokens(cfg)
    np.save(os.path.join(args.out, "tokens.npy"), tokens)
    np.save(os.path.join(args.out, "positions.npy"), positions)
    with open(os.path.join(args.out, "training.json"), "w", encoding="utf-8") as f:
        json.dump({"command": "scripts/train_tiny_llama.py " + " ".join(sys.argv[1:]), "steps": args.steps,
                   "batch": args.batch, "lr": args.lr, "seed": TRAIN_SEED, "heldout_seed": HELDOUT_SEED,
                   "untrained_heldout_loss": round(untrained, 4), "final_heldout_loss": round(final, 4),
                   "wall_s": round(wall), "curve": curve}, f, indent=1)
        f.write("\n")
    print(f"wrote {os.path.abspath(args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
