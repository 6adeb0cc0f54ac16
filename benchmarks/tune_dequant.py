"""Config sweep of the dequantize kernel behind the large-M (prefill) matmul on a GPU.

    python benchmarks/tune_dequant.py [--types Q4_K,Q6_K,Q8_0,Q5_0] [--m 4096]

The large-M path dequantizes a scratch chunk of rows (kernels.SCRATCH_BYTES of bf16) and hands it to cuBLAS,
chunk after chunk, so every prefill chunk of M tokens pays one full dequantization of every weight. For each type
and 27B shape: every (BLOCK_N, weights per program, num_warps) of the grid, time to dequantize the whole weight
chunk by chunk (CUDA graph, cycling through copies so nothing is served from L2) and its bandwidth (packed bytes
read + bf16 bytes written) as a fraction of the copy bandwidth measured in the same run; then the whole large-M
matmul at M = --m with the shipped and the best config, against cuBLAS on an already-dense bf16 weight. One JSON
line per (type, shape); the last line holds the best config per type by geometric mean.
"""
from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from gguf import GGMLQuantizationType as QT  # noqa: E402

from bench_gemv import copy_bandwidth, packed_copies, time_graph  # noqa: E402
from dflash24.quant import kernels as K  # noqa: E402
from dflash24.quant.packed import GEOMETRY  # noqa: E402

SHAPES = [(17408, 5120), (5120, 17408)]
GRID = {"BLOCK_N": (4, 8, 16, 32), "weights": (256, 512, 1024), "num_warps": (2, 4, 8)}


def dequant_all(p, w, cfg):
    """The whole weight through the scratch chunk w, as _matmul_large walks it."""
    chunk = w.shape[0]
    for n0 in range(0, p.n, chunk):
        K.dequant_rows(p, n0, min(p.n, n0 + chunk), w, cfg)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--types", default="Q4_K,Q6_K,Q8_0,Q5_0")
    ap.add_argument("--m", type=int, default=4096)
    ap.add_argument("--min-ms", type=float, default=20.0)
    ap.add_argument("--grid", default="", help="JSON dict overriding axes of GRID")
    args = ap.parse_args()
    GRID.update({kk: tuple(v) for kk, v in json.loads(args.grid or "{}").items()})
    dev = torch.device("cuda")
    bw = copy_bandwidth(1 << 30)
    print(json.dumps({"copy_GBps": round(bw / 1e9, 1), "device": torch.cuda.get_device_name()}), flush=True)
    scores: dict[str, dict[tuple, list[float]]] = {}
    for name in args.types.split(","):
        q = QT[name]
        bs, _ = GEOMETRY[q]
        for n, k in SHAPES:
            copies = packed_copies(q, n, k)
            chunk = min(n, max(256, K.SCRATCH_BYTES // (2 * k) // 256 * 256))
            w = torch.empty((chunk, k), device=dev, dtype=torch.bfloat16)
            nbytes = copies[0].nbytes + 2 * n * k
            base = K.dequant_config(copies[0])
            t_base = time_graph([lambda p=p: dequant_all(p, w, base) for p in copies], min_ms=args.min_ms, repeats=3)
            rows = []
            for bn, wts, nw in itertools.product(*GRID.values()):
                cfg = dict(BLOCK_N=bn, G=max(1, wts // bs), num_warps=nw)
                try:
                    t = time_graph([lambda p=p, c=cfg: dequant_all(p, w, c) for p in copies], min_ms=args.min_ms,
                                   repeats=3)
                except Exception as e:  # noqa: BLE001 - a config the compiler or the SM cannot take
                    print(json.dumps({"fail": [name, n, k, bn, wts, nw], "error": str(e)[:120]}), flush=True)
                    continue
                rows.append((t, (bn, wts, nw)))
                scores.setdefault(name, {}).setdefault((bn, wts, nw), []).append(t / t_base)
            rows.sort()
            best = dict(BLOCK_N=rows[0][1][0], G=max(1, rows[0][1][1] // bs), num_warps=rows[0][1][2])
            x = torch.randn(args.m, k, device=dev, dtype=torch.bfloat16)
            dense = torch.randn(n, k, device=dev, dtype=torch.bfloat16)
            t_cublas = time_graph([lambda: torch.matmul(x, dense.T)], min_ms=args.min_ms, repeats=3)
            t_large = time_graph([lambda p=p: K._matmul_large(x, p) for p in copies[:2]], min_ms=args.min_ms,
                                 repeats=3)
            print(json.dumps({
                "type": name, "N": n, "K": k, "scratch_rows": chunk,
                "dequant_us": round(t_base * 1e6, 1), "dequant_frac_copy": round(nbytes / t_base / bw, 3),
                "best": [{"cfg": key, "us": round(t * 1e6, 1), "frac_copy": round(nbytes / t / bw, 3)}
                         for t, key in rows[:5]],
                "large_m": args.m, "large_m_us": round(t_large * 1e6, 1), "cublas_dense_us": round(t_cublas * 1e6, 1),
                "large_over_dense": round(t_large / t_cublas, 3), "best_cfg": best}), flush=True)
            copies = w = x = dense = None
            torch.cuda.empty_cache()
    summary = {}
    for name, by_key in scores.items():
        key, r = min(((kk, math.exp(sum(map(math.log, v)) / len(v))) for kk, v in by_key.items()
                      if len(v) == len(SHAPES)), key=lambda kv: kv[1])
        summary[name] = {"cfg": key, "geomean_vs_shipped": round(r, 3)}
    print(json.dumps({"best_per_type": summary}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
