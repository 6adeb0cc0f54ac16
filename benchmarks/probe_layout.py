"""Does the small-M matmul's weight access pattern, not its arithmetic, cap its bandwidth? Loads only, no decode:
each program streams the words of its row tile (BLOCK_N rows x 32 words a step, as the Q4_K dot kernel reads them)
over its slice of K and folds them into one value, in two layouts of the same bytes:

- rows: the packed layout as shipped, row-major words: a step's tile is BLOCK_N runs of 128 bytes, one per row,
  a row stride apart (K / 2 bytes);
- tiles: the same words reordered tile-major: a step's tile is one contiguous run of BLOCK_N x 128 bytes.

    python benchmarks/probe_layout.py [--shapes 17408x5120,5120x17408] [--splits 2,7]

Prints one JSON line per shape: us per call of each layout (CUDA-graph median over weight copies that defeat L2) and
the bandwidth they reach, against a device-to-device copy of the same bytes measured in the same run.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_gemv import time_graph  # noqa: E402


@triton.jit
def _stream_kernel(w_ptr, out_ptr, ROW_WORDS, STEPS_PER_SPLIT, TILES_MAJOR: tl.constexpr, BLOCK_N: tl.constexpr,
                   STEPS: tl.constexpr, STAGES: tl.constexpr):
    t = tl.program_id(0)
    s = tl.program_id(1)
    r = tl.arange(0, BLOCK_N)[:, None]
    c = tl.arange(0, 32)[None, :]
    acc = tl.zeros((BLOCK_N, 32), dtype=tl.int32)
    for j in tl.range(s * STEPS_PER_SPLIT, (s + 1) * STEPS_PER_SPLIT, num_stages=STAGES):
        if TILES_MAJOR:     # [tile][step][row][word]
            off = (t.to(tl.int64) * STEPS + j) * (BLOCK_N * 32) + r * 32 + c
        else:               # [row][word]: row t BLOCK_N + r, words 32 j ..
            off = (t.to(tl.int64) * BLOCK_N + r) * ROW_WORDS + j * 32 + c
        acc ^= tl.load(w_ptr + off)
    tl.store(out_ptr + t * tl.num_programs(1) + s, tl.sum(tl.sum(acc & 0xFFFF, axis=1), axis=0))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="17408x5120,5120x17408")
    ap.add_argument("--splits", default="2,7", help="K splits per shape (programs = row tiles x split)")
    ap.add_argument("--block-n", type=int, default=128)
    ap.add_argument("--stages", default="1,2,3")
    ap.add_argument("--min-ms", type=float, default=1.0)
    args = ap.parse_args()
    dev = torch.device("cuda")
    for shape, split in zip(args.shapes.split(","), [int(v) for v in args.splits.split(",")]):
        n, k = (int(v) for v in shape.split("x"))
        row_words, steps, bn = k // 8, k // 256, args.block_n
        copies = max(2, -(-200 * 2**20 // (n * row_words * 4)))       # > 4x the 50 MiB L2
        rows = [torch.randint(-2**31, 2**31 - 1, (n, row_words), device=dev, dtype=torch.int32) for _ in range(copies)]
        tiles = [w.view(n // bn, bn, steps, 32).permute(0, 2, 1, 3).contiguous() for w in rows]
        out = torch.empty(n // bn * split, device=dev, dtype=torch.int32)
        copy_dst = torch.empty_like(rows[0])
        t_copy = time_graph([lambda w=w: copy_dst.copy_(w) for w in rows], min_ms=args.min_ms, repeats=3)
        rep = {"N": n, "K": k, "split": split, "programs": n // bn * split, "copies": copies,
               "copy_us": round(t_copy * 1e6, 2), "copy_GBps": round(2 * rows[0].numel() * 4 / t_copy / 1e9, 1)}
        read = n * split * (steps // split) * 32 * 4                       # bytes the programs read
        for stages in (int(v) for v in args.stages.split(",")):
            for name, ws, major in (("rows", rows, False), ("tiles", tiles, True)):
                def run(w):
                    _stream_kernel[(n // bn, split)](w, out, row_words, steps // split, TILES_MAJOR=major,
                                                     BLOCK_N=bn, STEPS=steps, STAGES=stages, num_warps=4)
                t = time_graph([lambda w=w: run(w) for w in ws], min_ms=args.min_ms, repeats=3)
                rep[f"{name}_s{stages}_us"] = round(t * 1e6, 2)
                rep[f"{name}_s{stages}_GBps"] = round(read / t / 1e9, 1)
        print(json.dumps(rep), flush=True)
        del rows, tiles
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
