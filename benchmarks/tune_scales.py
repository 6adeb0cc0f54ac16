"""How the block-scale fields are loaded, timed on a GPU: the M = 1 GEMV and the small-M dot kernel at their
shipped launch configs, with the scale fields loaded as they are (1- / 2-byte fields: synchronous loads inside the
loop unless a thread's share is >= 4 contiguous bytes) or as the int32 words holding them (the software pipeliner
copies them ahead with cp.async like the weight words): `kernels._load_scales` WORDS 0..3 (bit 0 the f16 fields,
bit 1 the byte fields); the dot kernel also in both orientations (w_as_a 0 / 1). --row-run: the shipped configs with
each row's words of a step loaded as one run or not (cfg row_run). --pairs: the dot kernel with the per-field decode
and with PAIRS (two 4- to 6-bit weights per 32-bit op, `kernels._bf16_pairs`), in both orientations.

    python benchmarks/tune_scales.py [--types Q4_K,Q5_K,Q6_K] [--shapes 17408x5120,...] [--m 16,23]
    python benchmarks/tune_scales.py --row-run [--types ...]   (the shipped configs with row_run off / on)
    python benchmarks/tune_scales.py --pairs --types Q4_K        (the dot kernel: pairs0 as shipped without PAIRS,
                                                                  pairs1 / pairs1_w with it, W_AS_A off / on)

One JSON line per (type, shape): [us per call (CUDA-graph median over enough weight copies to defeat L2), the
GEMV's fraction of the copy bandwidth measured in the same run / the dot's ratio to the WORDS 0 GEMV, max difference
from the WORDS 0 (and w_as_a 0) output relative to max |y| (fp32 rounding)] per variant ("gemv_w1", "dot16_w1a0").
"""
from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from gguf import GGMLQuantizationType as QT  # noqa: E402

from bench_gemv import copy_bandwidth, packed_copies, time_graph  # noqa: E402
from dflash24.quant import kernels as K  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--types", default="Q4_K,Q5_K,Q6_K")
    ap.add_argument("--shapes", default="17408x5120,5120x17408,12288x5120")
    ap.add_argument("--m", default="16,23")
    ap.add_argument("--min-ms", type=float, default=5.0)
    ap.add_argument("--row-run", action="store_true",
                    help="only time the shipped GEMV and dot configs with row_run off / on (each row's words of a step "
                         "loaded as one run): gemv_run{0,1}, dot{M}_run{0,1}")
    ap.add_argument("--pairs", action="store_true",
                    help="only the dot kernel without / with PAIRS (and PAIRS with W_AS_A): dot{M}_pairs0, _pairs1, "
                         "_pairs1_w, against the shipped GEMV")
    args = ap.parse_args()
    dev = torch.device("cuda")
    bw = copy_bandwidth(2 << 30)
    print(json.dumps({"copy_GBps": round(bw / 1e9, 1), "device": torch.cuda.get_device_name()}), flush=True)
    for name in args.types.split(","):
        q = QT[name]
        for shape in args.shapes.split(","):
            n, k = (int(v) for v in shape.split("x"))
            row = {"type": name, "N": n, "K": k}
            try:
                copies = packed_copies(q, n, k)
                nb = copies[0].nbytes
                x1 = torch.randn(1, k, device=dev, dtype=torch.bfloat16)
                base = K.gemv_config(copies[0], dev)
                y0 = K.gemv(x1, copies[0], dict(base, scale_words=0))
                t_gemv0 = None
                variants = [dict(base, row_run=v) for v in (False, True)] if args.row_run else \
                    [base] if args.pairs else [dict(base, scale_words=w) for w in range(4)]
                for cfg in variants:
                    words = cfg["scale_words"]
                    y = K.gemv(x1, copies[0], cfg)
                    t = time_graph([lambda p=p: K.gemv(x1, p, cfg) for p in copies], min_ms=args.min_ms, repeats=3)
                    t_gemv0 = t_gemv0 or t
                    key = f"gemv_run{int(cfg['row_run'])}" if args.row_run else f"gemv_w{words}"
                    row[key] = [round(t * 1e6, 2), round(nb / t / bw, 3),
                                f"{float((y - y0).abs().max() / y0.abs().max()):.1e}"]
                for m in (int(v) for v in args.m.split(",")):
                    x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
                    base = K.dot_config(copies[0], m, dev)
                    y0 = K._matmul_dot(x, copies[0], dict(base, scale_words=0, w_as_a=False), torch.float32, None)
                    if args.row_run:
                        dots = [(f"run{int(v)}", dict(base, row_run=v)) for v in (False, True)]
                    elif args.pairs:
                        dots = [("pairs0", dict(base, pairs=False)), ("pairs1", dict(base, pairs=True, w_as_a=False)),
                                ("pairs1_w", dict(base, pairs=True, w_as_a=True))]
                    else:
                        dots = [(f"w{w}a{int(a)}", dict(base, scale_words=w, w_as_a=a))
                                for w, a in itertools.product(range(4), (False, True))]
                    for variant, cfg in dots:
                        y = K._matmul_dot(x, copies[0], cfg, torch.float32, None)
                        t = time_graph([lambda p=p: K._matmul_dot(x, p, cfg, torch.float32, None) for p in copies],
                                       min_ms=args.min_ms, repeats=3)
                        row[f"dot{m}_{variant}"] = [round(t * 1e6, 2), round(t / t_gemv0, 2),
                                                 f"{float((y - y0).abs().max() / y0.abs().max()):.1e}"]
                del copies
                torch.cuda.empty_cache()
            except Exception as e:  # noqa: BLE001 - report and go on with the next shape
                row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
            print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
