"""Is the small-M matmul waiting on memory or on its own arithmetic? The same kernels timed twice on weights that
fit the 50 MiB L2: cycling through copies that defeat L2 (every byte from DRAM) and on one copy (served from L2
after the first call). A kernel bound by its arithmetic takes the same time both ways; one bound by memory latency
or bandwidth gets faster from L2.

    python benchmarks/probe_l2.py [--types Q4_K,Q6_K] [--shapes 8704x5120,5120x8704] [--m 1,16,23]

M = 1 is the int8 GEMV, M > 1 the shipped dot kernel (x in pair order, as a verify step hands it). One JSON line
per (type, shape, M): us from DRAM, us from L2, and their ratio.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from gguf import GGMLQuantizationType as QT  # noqa: E402

from bench_gemv import packed_copies, time_graph  # noqa: E402
from dflash24.quant import kernels as K  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--types", default="Q4_K,Q6_K")
    ap.add_argument("--shapes", default="8704x5120,5120x8704")
    ap.add_argument("--m", default="1,16,23")
    ap.add_argument("--min-ms", type=float, default=1.0)
    args = ap.parse_args()
    for name in args.types.split(","):
        q = QT[name]
        for sh in args.shapes.split(","):
            n, k = (int(v) for v in sh.split("x"))
            copies = packed_copies(q, n, k)
            for m in (int(v) for v in args.m.split(",")):
                x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
                if m == 1:
                    def run(p, x=x):
                        return K.gemv(x, p)
                else:
                    xp = K.pair_order(x, q).contiguous() if q in K.XPERM_TYPES else None

                    def run(p, x=x, xp=xp):
                        return K._matmul_dot(x, p, None, torch.float32, None, x_pairs=xp)
                t_dram = time_graph([lambda p=p: run(p) for p in copies], min_ms=args.min_ms, repeats=3)
                t_l2 = time_graph([lambda p=copies[0]: run(p)], min_ms=args.min_ms, repeats=3)
                print(json.dumps({"type": name, "N": n, "K": k, "M": m, "MiB": round(copies[0].nbytes / 2**20, 1),
                                  "copies": len(copies), "dram_us": round(t_dram * 1e6, 2),
                                  "l2_us": round(t_l2 * 1e6, 2), "l2_over_dram": round(t_l2 / t_dram, 3)}),
                      flush=True)
            del copies
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
