"""Time the decode step's fused residual add + RMSNorm (+ int8 activations) alone, per columns-a-program setting.

    python benchmarks/probe_norm.py [--d 5120] [--calls 129] [--cols 0,256,512,1024]

A one-token row of d values through `calls` dependent add_rms_norm calls (each reads the one before's output and
sum, as the decode step's layers do), captured in one CUDA graph with the package's launch options (PDL on sm_90).
Prints one JSON line per setting: microseconds a call, and whether the outputs equal the one-program-a-row ones.
"""
import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from dflash24.kernels import norm  # noqa: E402
from dflash24.quant import kernels  # noqa: E402


def chain(x, r, w, calls):
    for _ in range(calls):
        r, x = norm.add_rms_norm(x, r, w, 1e-6, int8=True)
    return x, r


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--d", type=int, default=5120)
    ap.add_argument("--calls", type=int, default=129)
    ap.add_argument("--cols", default="0,256,512,1024")
    ap.add_argument("--reps", type=int, default=200)
    a = ap.parse_args()
    g = torch.Generator().manual_seed(0)
    x0, r0 = (torch.randn(2, 1, a.d, generator=g) * 3).to(torch.bfloat16).cuda()
    w = (1 + 0.1 * torch.randn(a.d, generator=g)).cuda()
    ref = None
    for cols in [int(c) for c in a.cols.split(",")]:
        norm.COLS = cols
        x, r = x0.clone(), r0.clone()
        out = chain(x, r, w, a.calls)                           # compile, and the outputs to compare
        y_rows = [*out, *getattr(out[0], kernels.INT8_ATTR)]
        if ref is None:
            ref = y_rows
        same = all(torch.equal(p, q) for p, q in zip(y_rows, ref))
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            chain(x, r, w, a.calls)
        for _ in range(10):
            graph.replay()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        for _ in range(a.reps):
            graph.replay()
        end.record()
        torch.cuda.synchronize()
        us = start.elapsed_time(end) * 1e3 / a.reps / a.calls
        print(json.dumps({"d": a.d, "cols": cols, "programs": norm._tile(1, a.d)[0][1], "us_per_call": round(us, 3),
                          "same_bits_as_first": same}), flush=True)


if __name__ == "__main__":
    main()
