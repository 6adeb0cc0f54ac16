"""Config sweep of the small-M tl.dot path (verification of a drafted block: M = 16 chain, 23 tree) on a GPU.

    python benchmarks/tune_dot.py [--types Q4_K,Q6_K,Q5_K] [--m 16] [--kernel dot|mmq]

For each type and 27B shape: every (BLOCK_N, G, num_warps, num_stages, waves, w_as_a, xperm, maxnreg, stream) of the
grid, timed at M = --m (CUDA graph of 8 copies of the weight, so nothing is served from L2), as a ratio to the shipped dot_config
and to the M = 1 GEMV of the same weight; and the large-M path (dequantized chunks + cuBLAS) at the same M.
w_as_a: the decoded weight tile as the dot's first operand, so BLOCK_N is the MMA's M (wgmma on sm_90 needs
64; with x first, M = 16 runs on mma.sync); scale loads, word runs and the PAIRS decode as the shipped config has
them; xperm: x handed in `pair_order` (made once, outside the timing, as the norms make it); maxnreg: a register
cap per thread (0: none), so that more programs fit an SM (65,536 registers); stream: the STREAM split with that
many programs per SM (`kernels.stream_split`; 0: the K split of `waves`). One JSON line per
(type, shape) with the best five configs; the last line lists the config with the best
geometric-mean ratio per type (what `_DOT_TILE` should hold).
--kernel mmq sweeps the int8 tensor-core kernel instead (grid GRID_MMQ; what `_MMQ_TILE` should hold), with each
config's max error relative to the shipped dot kernel's output (int8 activations: about 1e-2).
"""
from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from gguf import GGMLQuantizationType as QT  # noqa: E402

from bench_gemv import packed_copies, time_graph  # noqa: E402
from dflash24.quant import kernels as K  # noqa: E402
from dflash24.quant.packed import GEOMETRY  # noqa: E402

SHAPES = [(17408, 5120), (5120, 17408), (12288, 5120), (5120, 6144)]
GRID = dict(BLOCK_N=(64, 128), G=(1, 2), num_warps=(4, 8), num_stages=(2, 3), waves=(2, 4, 8), w_as_a=(False, True),
            xperm=(False,), maxnreg=(0,), stream=(0,))
# --kernel mmq: the int8 tensor-core path (kernels._mmq_kernel), one 32-weight group a step
GRID_MMQ = dict(BLOCK_N=(32, 64, 128, 256), num_warps=(2, 4, 8), waves=(2, 4, 8))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--types", default="Q4_K,Q6_K,Q5_K")
    ap.add_argument("--m", type=int, default=16)
    ap.add_argument("--min-ms", type=float, default=3.0)
    ap.add_argument("--grid", default="", help="JSON dict overriding axes of GRID, e.g. '{\"num_warps\": [1, 2]}'")
    ap.add_argument("--shapes", default="", help="e.g. 17408x5120,5120x17408 (default: the four 27B shapes)")
    ap.add_argument("--kernel", choices=("dot", "mmq"), default="dot",
                    help="dot: the bf16 tl.dot kernel; mmq: the int8 tensor-core kernel (grid GRID_MMQ)")
    args = ap.parse_args()
    grid = GRID if args.kernel == "dot" else GRID_MMQ
    grid.update({kk: tuple(v) for kk, v in json.loads(args.grid or "{}").items()})
    shapes = [tuple(int(v) for v in sh.split("x")) for sh in args.shapes.split(",")] if args.shapes else SHAPES
    dev = torch.device("cuda")
    sms = K._sms(dev)
    t0 = time.time()
    scores: dict[str, dict[tuple, list[float]]] = {}
    for name in args.types.split(","):
        q = QT[name]
        bs, _ = GEOMETRY[q]
        for n, k in shapes:
            copies = packed_copies(q, n, k)
            x = torch.randn(args.m, k, device=dev, dtype=torch.bfloat16)
            x1 = x[:1].contiguous()
            xp = K.pair_order(x, q).contiguous() if k % K.STEP_WEIGHTS == 0 and GEOMETRY[q][1] == 8 else None
            t_gemv = time_graph([lambda p=p: K.gemv(x1, p) for p in copies], min_ms=args.min_ms, repeats=3)
            base = K.dot_config(copies[0], args.m, dev)
            t_base = time_graph([lambda p=p: K._matmul_dot(x, p, base, torch.float32, None) for p in copies],
                                min_ms=args.min_ms, repeats=3)
            rows = []
            t_large = time_graph([lambda p=p: K._matmul_large(x, p) for p in copies], min_ms=args.min_ms, repeats=3)
            y_base = K._matmul_dot(x, copies[0], base, torch.float32, None)
            err = {}
            for key in itertools.product(*grid.values()):
                if args.kernel == "dot":
                    a = dict(zip(grid, key))
                    g_blocks = max(1, a["G"] * 256 // bs)     # G counts scale blocks: 256 or 512 weights a step
                    cfg = dict(BLOCK_M=base["BLOCK_M"], BLOCK_N=a["BLOCK_N"], G=g_blocks, num_warps=a["num_warps"],
                               num_stages=a["num_stages"], w_as_a=a["w_as_a"], scale_words=base["scale_words"],
                               row_run=base["row_run"], pairs=base["pairs"], maxnreg=a.get("maxnreg", 0))
                    cfg["split"], cfg["per"] = K._split(-(-n // a["BLOCK_N"]), k // bs, g_blocks, sms,
                                                        waves=a["waves"], min_steps=2)
                    cfg["stream"] = 0
                    if a.get("stream"):               # programs per SM; the waves axis does not apply
                        if a["waves"] != grid["waves"][0] or -(-n // a["BLOCK_N"]) >= a["stream"] * sms:
                            continue
                        cfg["stream"], cfg["split"] = K.stream_split(-(-n // a["BLOCK_N"]), -(-(k // bs) // g_blocks),
                                                                     a["stream"] * sms)
                    if a["xperm"] and xp is None:
                        continue

                    def run(x, p, c, dt, b, xx=xp if a["xperm"] else None):
                        return K._matmul_dot(x, p, c, dt, b, x_pairs=xx)
                else:
                    bn, w, waves = key
                    cfg = dict(kernel="mmq", BLOCK_M=base["BLOCK_M"], BLOCK_N=bn, num_warps=w)
                    cfg["split"], cfg["per"] = K._split(-(-n // bn), k // 32, 1, sms, waves=waves, min_steps=2)
                    run = K._matmul_mmq
                try:
                    y = run(x, copies[0], cfg, torch.float32, None)
                    err[key] = float((y - y_base).abs().max() / y_base.abs().max())
                    t = time_graph([lambda p=p, c=cfg: run(x, p, c, torch.float32, None) for p in copies],
                                   min_ms=args.min_ms, repeats=3)
                except Exception as e:  # noqa: BLE001 - a config the compiler or the SM cannot take
                    print(json.dumps({"fail": [name, n, k, *key], "error": str(e)[:120]}), flush=True)
                    continue
                rows.append((t, key))
                scores.setdefault(name, {}).setdefault(key, []).append(t / t_base)
            rows.sort()
            print(json.dumps({"type": name, "N": n, "K": k, "M": args.m, "gemv_us": round(t_gemv * 1e6, 2),
                              "default_us": round(t_base * 1e6, 2), "default_over_gemv": round(t_base / t_gemv, 2),
                              "dequant_chunks_cublas_us": round(t_large * 1e6, 2),
                              "best": [{"cfg": dict(zip(grid, key)), "us": round(t * 1e6, 2),
                                        "over_gemv": round(t / t_gemv, 2), "rel_err_vs_default": f"{err[key]:.2e}"}
                                       for t, key in rows[:5]],
                              "all_us": [[round(t * 1e6, 2), *key] for t, key in rows],
                              "elapsed_s": round(time.time() - t0)}), flush=True)
            del copies
            torch.cuda.empty_cache()
    best = {}
    for name, by_key in scores.items():
        full = {key: v for key, v in by_key.items() if len(v) == len(shapes)}
        key = min(full, key=lambda kk: math.prod(full[kk]) ** (1 / len(full[kk])))
        best[name] = {"cfg": dict(zip(grid, key)),
                      "geomean_over_default": round(math.prod(full[key]) ** (1 / len(full[key])), 3)}
    print(json.dumps({"best_per_type": best}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
