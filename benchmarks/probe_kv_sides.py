"""Where a quantized step's time goes by side: the 27B's attention step (24 / 4 heads of 256) over K and V of
different types, one side quantized at a time, by context and split count (CUDA GPU).

    python benchmarks/probe_kv_sides.py [--pairs q4_0:q4_0,q4_0:bf16,bf16:q4_0] [--steps 1,16] [--ctx 4096,32768]
                                        [--splits 1,4,16]

Prints a line per case: K type, V type, T, context, split count (auto: the engine's pick), microseconds (the
median of bench_attention.time_graph's CUDA-graph replays over enough cache copies to leave L2).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_attention import L2_FLUSH_BYTES, make_cache, time_graph  # noqa: E402
from dflash24.cache import kvquant  # noqa: E402
from dflash24.kernels import attention as A  # noqa: E402


def row_bytes(kv: str, D: int) -> int:
    return kvquant.row_bytes(kv, D) if kv in kvquant.QUANT_TYPES else D * kvquant.DENSE_TYPES[kv].itemsize


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", default="q4_0:q4_0,q4_0:bf16,bf16:q4_0,q8_0:q8_0,q8_0:bf16,bf16:q8_0,bf16:bf16")
    ap.add_argument("--steps", default="1,16")
    ap.add_argument("--ctx", default="4096,32768")
    ap.add_argument("--splits", default="", help="also these split counts (comma-separated) for T > 1")
    ap.add_argument("--heads", type=int, default=24)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--head-dim", type=int, default=256)
    args = ap.parse_args()
    H, Hk, D, dev = args.heads, args.kv_heads, args.head_dim, "cuda"
    gen = torch.Generator().manual_seed(0)
    for pair in args.pairs.split(","):
        kt, vt = pair.split(":")
        for ctx in (int(c) for c in args.ctx.split(",")):
            kv_bytes = ctx * Hk * (row_bytes(kt, D) + row_bytes(vt, D))
            copies = max(1, min(8, -(-L2_FLUSH_BYTES // kv_bytes)))
            caches = [(make_cache(kt, ctx, Hk, D, dev), make_cache(vt, ctx, Hk, D, dev)) for _ in range(copies)]
            for T in (int(t) for t in args.steps.split(",")):
                q = torch.randn(T, H, D, generator=gen).to(dev, torch.bfloat16)
                slots = torch.arange(ctx - T, ctx, device=dev)
                splits = [None] + ([int(s) for s in args.splits.split(",")] if args.splits and T > 1 else [])
                for n in splits:
                    fns = [lambda k=k, v=v: A.attention(q, k, v, D ** -0.5, ctx, slots=slots, n_splits=n)
                           for k, v in caches]
                    try:
                        us = f"{time_graph(fns) * 1e6:.1f}"
                    except Exception as e:  # noqa: BLE001
                        us = f"{type(e).__name__}: {e}"[:120]
                    print(kt, vt, T, ctx, n or "auto", us, flush=True)
            del caches
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
