"""The small-M matmuls on int8 activations -- the token-tile GEMV (`DFLASH24_SMALL_M_MATMUL=int8`, dp4a) and the
int8 tensor-core path (`=mma`) -- against the tl.dot path on a GPU, per verify-step size, on the 27B shapes; then
small launch-config sweeps of both at M = 16 and 23.

    python benchmarks/tune_tokens.py [--types Q4_K,Q6_K] [--m 2,4,8,16,23] [--sweep-m 16,23]

Each time is the median of CUDA-graph replays cycling through copies of the weight (nothing served from L2), as a
ratio to the one-token GEMV of the same weight (the decode step's matmul): the chain goal needs a 16-token verify
at about 1.2x of it. One JSON line per (type, shape): per M the shipped token-tile config and the dot path; then the
sweep's best five configs per (type, shape, M); the last line: the config with the best geometric-mean ratio per
type and M (what `tokens_config` should choose).
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

SHAPES = [(17408, 5120), (5120, 17408), (12288, 5120), (5120, 6144)]
SWEEP = dict(MT=(8, 16), G=(4, 8, 16), BLOCK_N=(4, 8), num_warps=(2, 4), stages=(3,))
SWEEP_MMA = dict(BLOCK_N=(64, 128), num_warps=(4,), stages=(2, 3), waves=(4, 8))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--types", default="Q4_K,Q6_K")
    ap.add_argument("--m", default="2,4,8,16,23")
    ap.add_argument("--sweep-m", default="16,23")
    ap.add_argument("--min-ms", type=float, default=3.0)
    args = ap.parse_args()
    dev = torch.device("cuda")
    ms = [int(v) for v in args.m.split(",")]
    sweep_ms = [int(v) for v in args.sweep_m.split(",") if v]
    t0 = time.time()
    scores: dict = {}

    def timed(fn_of_p, copies):
        return time_graph([lambda p=p: fn_of_p(p) for p in copies], min_ms=args.min_ms, repeats=3)

    for name in args.types.split(","):
        q = QT[name]
        for n, k in SHAPES:
            copies = packed_copies(q, n, k)
            x_all = torch.randn(max(ms + sweep_ms), k, device=dev, dtype=torch.bfloat16)
            x1 = x_all[:1].contiguous()
            t_gemv = timed(lambda p: K.gemv(x1, p), copies)
            row = {"type": name, "N": n, "K": k, "gemv_us": round(t_gemv * 1e6, 2), "by_m": {}}
            for m in ms:
                x = x_all[:m].contiguous()
                t_tok = timed(lambda p: K.gemv(x, p), copies)
                t_dot = timed(lambda p: K._matmul_dot(x, p, None, torch.float32, None), copies)
                t_mma = timed(lambda p: K._matmul_mma(x, p, None, torch.float32, None), copies)
                row["by_m"][m] = {"token_tile_over_gemv": round(t_tok / t_gemv, 3),
                                  "mma_over_gemv": round(t_mma / t_gemv, 3),
                                  "dot_over_gemv": round(t_dot / t_gemv, 3),
                                  "token_tile_cfg": {kk: v for kk, v in K.tokens_config(copies[0], m, dev).items()}}
            print(json.dumps(row), flush=True)
            for m in sweep_ms:
                x = x_all[:m].contiguous()
                base = K.tokens_config(copies[0], m, dev)
                results = []
                for key in itertools.product(*SWEEP.values()):
                    c = dict(base, **dict(zip(SWEEP, key)))
                    c["MT"] = min(c["MT"], 1 << (m - 1).bit_length())
                    try:
                        t = timed(lambda p, c=c: K.gemv(x, p, c), copies)
                    except Exception as e:  # noqa: BLE001 - a config the compiler or the SM cannot take
                        print(json.dumps({"fail": [name, n, k, m, *key], "error": str(e)[:120]}), flush=True)
                        continue
                    results.append((t, key))
                    scores.setdefault((name, m), {}).setdefault(key, []).append(t / t_gemv)
                results.sort()
                base = K.mma_config(copies[0], m, dev)
                bs = K.GEOMETRY[q][0]
                mma_results = []
                for key in itertools.product(*SWEEP_MMA.values()):
                    c = dict(base, **dict(zip(SWEEP_MMA, key)))
                    n_prog = -(-n // c["BLOCK_N"]) * -(-m // c["BLOCK_M"])
                    c["split"], c["per"] = K._split(n_prog, k // bs, 32 // bs, K._sms(dev), waves=c.pop("waves"),
                                                    min_steps=4)
                    try:
                        t = timed(lambda p, c=c: K._matmul_mma(x, p, c, torch.float32, None), copies)
                    except Exception as e:  # noqa: BLE001
                        print(json.dumps({"fail_mma": [name, n, k, m, *key], "error": str(e)[:120]}), flush=True)
                        continue
                    mma_results.append((t, key))
                    scores.setdefault((name + " mma", m), {}).setdefault(key, []).append(t / t_gemv)
                mma_results.sort()
                print(json.dumps({"type": name, "N": n, "K": k, "M": m, "sweep_best": [
                    {"cfg": dict(zip(SWEEP, kk)), "over_gemv": round(t / t_gemv, 3)} for t, kk in results[:5]],
                    "mma_sweep_best": [{"cfg": dict(zip(SWEEP_MMA, kk)), "over_gemv": round(t / t_gemv, 3)}
                                       for t, kk in mma_results[:5]],
                    "elapsed_s": round(time.time() - t0)}), flush=True)
            del copies
            torch.cuda.empty_cache()
    best = {}
    for (name, m), by_key in scores.items():
        full = {kk: v for kk, v in by_key.items() if len(v) == len(SHAPES)}
        if full:
            kk = min(full, key=lambda c: math.prod(full[c]))
            grid = SWEEP_MMA if name.endswith(" mma") else SWEEP
            best[f"{name} M={m}"] = {"cfg": dict(zip(grid, kk)),
                                     "geomean_over_gemv": round(math.prod(full[kk]) ** (1 / len(full[kk])), 3)}
    print(json.dumps({"best_per_type_and_m": best}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
