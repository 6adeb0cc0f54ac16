"""The small-M dot kernel with x in pair order (XPERM) against the shipped kernel, on a GPU.

    python benchmarks/probe_xperm.py [--types Q4_K,Q6_K,Q5_K] [--m 16,23]

Per type, 27B shape and M: the M = 1 GEMV, the shipped dot config, the same config with XPERM on an x already in
`pair_order` (the kernel alone), the permutation included (pair_order + kernel), and XPERM with the other
orientation (W_AS_A flipped) and with 2-warp tiles of 64 rows. Microseconds (CUDA-graph median, copies of the
weight cycled so nothing is served from L2) and each variant's max |y - y_shipped| / max |y_shipped|. One JSON line
per (type, shape, M).
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

SHAPES = [(17408, 5120), (5120, 17408), (12288, 5120)]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--types", default="Q4_K,Q6_K,Q5_K")
    ap.add_argument("--m", default="16,23")
    ap.add_argument("--min-ms", type=float, default=3.0)
    ap.add_argument("--shapes", default="", help="e.g. 248320x5120 (default: three 27B shapes)")
    args = ap.parse_args()
    shapes = [tuple(int(v) for v in sh.split("x")) for sh in args.shapes.split(",")] if args.shapes else SHAPES
    dev = torch.device("cuda")
    sms = K._sms(dev)
    for name in args.types.split(","):
        q = QT[name]
        bs = K.GEOMETRY[q][0]
        for n, k in shapes:
            copies = packed_copies(q, n, k)
            for m in (int(v) for v in args.m.split(",")):
                x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
                xp = K.pair_order(x, q).contiguous()
                x1 = x[:1].contiguous()
                base = K.dot_config(copies[0], m, dev)
                two = dict(base, BLOCK_N=64, num_warps=2, w_as_a=False)
                two["split"], two["per"] = K._split(-(-n // 64), k // bs, base["G"], sms, waves=4, min_steps=2)
                variants = {        # (config, x in pair order: made once / made in every call / none)
                    "shipped": (base, None),
                    "xperm": (base, "once"),
                    "xperm_with_permute": (base, "each"),
                    "xperm_flipped": (dict(base, w_as_a=not base["w_as_a"]), "once"),
                    "xperm_2warps_64": (two, "once"),
                    "2warps_64": (two, None),
                }
                y0 = K._matmul_dot(x, copies[0], base, torch.float32, None)
                row = {"type": name, "N": n, "K": k, "M": m,
                       "gemv_us": round(time_graph([lambda p=p: K.gemv(x1, p) for p in copies],
                                                   min_ms=args.min_ms, repeats=3) * 1e6, 2)}
                for key, (cfg, made) in variants.items():
                    def call(p, c=cfg, made=made):
                        xx = xp if made == "once" else K.pair_order(x, q).contiguous() if made == "each" else None
                        return K._matmul_dot(x, p, c, torch.float32, None, x_pairs=xx)
                    try:
                        y = call(copies[0])
                        t = time_graph([lambda p=p, f=call: f(p) for p in copies], min_ms=args.min_ms, repeats=3)
                    except Exception as e:  # noqa: BLE001 - report and go on
                        row[key] = {"error": str(e)[:160]}
                        continue
                    row[key] = {"us": round(t * 1e6, 2),
                                "err": float((y - y0).abs().max() / y0.abs().max())}
                print(json.dumps(row), flush=True)
            del copies
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
