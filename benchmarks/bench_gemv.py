"""Block-matmul kernels on a CUDA GPU: bandwidth at M=1, cost of small M, prefill TFLOP/s.

    python benchmarks/bench_gemv.py [--quick] [--json-out FILE]

Measured in this run (ratios, never bare times from another run):
- device-to-device copy bandwidth (bytes read + written / time) of a 4 GB buffer;
- for Q4_K, Q6_K, Q5_0, Q8_0 at (N, K) = (17408,5120), (5120,17408), (12288,5120), (248320,5120):
  GEMV (M=1) GB/s of packed weight bytes and its fraction of copy bandwidth; time of M=16/23/64
  relative to M=1; large-M TFLOP/s at M=512 and 4096;
- bf16 cuBLAS (torch.matmul) on the same shapes for comparison;
- a correctness spot check of each type against the reference (dequantize + fp32 matmul).
Timing: each measured call is replayed from a CUDA graph (launch overhead excluded, as in the
engine's decode graph), cycling over enough weight copies that the weights never sit in L2.
Random packed bytes with finite fp16 scales: speed does not depend on the values.
"""
from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gguf import GGMLQuantizationType as QT  # noqa: E402

from dflash24.quant import kernels  # noqa: E402
from dflash24.quant.formats import random_raw  # noqa: E402
from dflash24.quant.packed import pack  # noqa: E402

L2_FLUSH_BYTES = 512 << 20      # weights touched between two uses of one copy (H200 L2 is 50 MiB)


def time_graph(fns, min_ms: float = 30.0, repeats: int = 5) -> float:
    """Median seconds per call of the callables `fns` (called round robin) replayed in a CUDA graph."""
    for f in fns:                                   # compile / autotune / allocate outside capture
        f()
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):                 # warm-up on a side stream (CUDA graph requirement)
        for f in fns:
            f()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    # One eager round to size the graph.
    t = time.perf_counter()
    for f in fns:
        f()
    torch.cuda.synchronize()
    per_call = max((time.perf_counter() - t) / len(fns), 1e-6)
    n_calls = len(fns) * max(1, math.ceil(min_ms / 1e3 / per_call / len(fns)))
    n_calls = min(n_calls, max(len(fns), 2000))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(n_calls):
            fns[i % len(fns)]()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / n_calls)
    del graph
    times.sort()
    return times[len(times) // 2]


def copy_bandwidth(nbytes: int) -> float:
    """Bytes read + written per second by a device-to-device copy (torch copy_)."""
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    src.random_(0, 255)
    dst = torch.empty_like(src)
    dst.copy_(src)
    torch.cuda.synchronize()
    n = 10
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(n):
        dst.copy_(src)
    end.record()
    end.synchronize()
    t = start.elapsed_time(end) / 1e3 / n
    del src, dst
    torch.cuda.empty_cache()
    return 2 * nbytes / t


def packed_copies(qtype, n: int, k: int):
    """Enough independent random packed weights of (N, K) that cycling through them defeats L2."""
    one = pack(random_raw(qtype, n, k, d_scale=0.01, device="cuda"), qtype, k)
    copies = [one]
    while len(copies) * one.nbytes < L2_FLUSH_BYTES:
        copies.append(pack(random_raw(qtype, n, k, d_scale=0.01, device="cuda"), qtype, k))
    return copies


def check(qtype, n: int, k: int) -> dict:
    """Max relative error of M=1 and M=16 against the reference on one (smaller) weight."""
    raw = random_raw(qtype, n, k, d_scale=0.01, device="cuda")
    p = pack(raw, qtype, k)
    out = {}
    for m in (1, 16, 512):
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        ref = kernels.reference_matmul(x, raw, qtype, k)
        y = kernels.quant_matmul(x, p).float()
        out[f"rel_err_m{m}"] = float((y - ref).abs().max() / ref.abs().max())
    return out


def sweep_m(row: dict, n: int, k: int, nbytes: int, ms: list[int], copy_bw: float, min_ms: float, calls,
            out_bytes: int) -> None:
    """Time `calls(x)` (one callable per weight copy) for each M into row: GB/s and fraction of copy bandwidth
    at M=1, time relative to M=1 up to M=64, TFLOP/s above. Outputs over 2 GiB (vocab x 4096) are skipped."""
    t1 = None
    for m in ms:
        if m * n * out_bytes > (2 << 30):
            continue
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        t = time_graph(calls(x), min_ms=min_ms)
        row[f"us_m{m}"] = t * 1e6
        if m == 1:
            t1 = t
            row["gemv_GBps"] = nbytes / t / 1e9
            row["gemv_frac_copy"] = nbytes / t / copy_bw
        elif m <= 64 and t1 is not None:
            row[f"ratio_m{m}"] = t / t1
        else:
            row[f"tflops_m{m}"] = 2 * m * n * k / t / 1e12


def bench_quant(qtype, n: int, k: int, ms: list[int], copy_bw: float, min_ms: float) -> dict:
    copies = packed_copies(qtype, n, k)
    nbytes = copies[0].nbytes
    row = dict(qtype=qtype.name, N=n, K=k, packed_bytes=nbytes, copies=len(copies))
    sweep_m(row, n, k, nbytes, ms, copy_bw, min_ms,
            lambda x: [lambda p=p: kernels.quant_matmul(x, p) for p in copies], out_bytes=4)
    del copies
    torch.cuda.empty_cache()
    return row


def bench_cublas(n: int, k: int, ms: list[int], copy_bw: float, min_ms: float) -> dict:
    nbytes = n * k * 2
    n_copies = max(1, math.ceil(L2_FLUSH_BYTES / nbytes))
    ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(n_copies)]
    row = dict(qtype="bf16 cuBLAS", N=n, K=k, weight_bytes=nbytes, copies=n_copies)
    sweep_m(row, n, k, nbytes, ms, copy_bw, min_ms, lambda x: [lambda w=w: torch.matmul(x, w.T) for w in ws],
            out_bytes=2)
    del ws
    torch.cuda.empty_cache()
    return row


def fmt(v, spec):
    width = int(spec.split(".")[0])
    return format(v, spec) if isinstance(v, (int, float)) else "-".rjust(width)


def print_table(out: dict) -> None:
    print(f"\n{out['device']}  torch {out['torch']}  triton {out['triton']}  copy {out['copy_GBps']:.0f} GB/s")
    for name, c in out["checks"].items():
        print(f"check {name}: " + ", ".join(f"{k} {v:.1e}" for k, v in c.items()))
    hdr = (f"{'type':<12}{'N x K':>14}{'MB':>8}{'M=1 us':>9}{'GB/s':>8}{'%copy':>7}"
           f"{'x M16':>7}{'x M23':>7}{'x M64':>7}{'TF M512':>9}{'TF M4096':>10}")
    print(hdr)
    print("-" * len(hdr))
    for r in out["results"] + out["cublas"]:
        mb = r.get("packed_bytes", r.get("weight_bytes", 0)) / 1e6
        print(f"{r['qtype']:<12}{str(r['N']) + 'x' + str(r['K']):>14}{mb:>8.1f}{fmt(r.get('us_m1'), '9.1f')}"
              f"{fmt(r.get('gemv_GBps'), '8.0f')}{fmt(100 * r['gemv_frac_copy'] if 'gemv_frac_copy' in r else None, '7.1f')}"
              f"{fmt(r.get('ratio_m16'), '7.2f')}{fmt(r.get('ratio_m23'), '7.2f')}{fmt(r.get('ratio_m64'), '7.2f')}"
              f"{fmt(r.get('tflops_m512'), '9.1f')}{fmt(r.get('tflops_m4096'), '10.1f')}")
    for e in out["errors"]:
        print("ERROR", e)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="about one minute: 2 shapes, fewer M, short timing")
    ap.add_argument("--json-out", help="also write the JSON object to this file")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_gemv: needs a CUDA GPU", file=sys.stderr)
        return 2
    import triton
    torch.backends.cuda.matmul.allow_tf32 = False

    types = [QT.Q4_K, QT.Q6_K, QT.Q5_0, QT.Q8_0]
    if args.quick:
        shapes = [(17408, 5120), (5120, 17408)]
        ms = [1, 16, 23, 64, 512]
        min_ms, copy_bytes = 10.0, 1 << 30
    else:
        shapes = [(17408, 5120), (5120, 17408), (12288, 5120), (248320, 5120)]
        ms = [1, 16, 23, 64, 512, 4096]
        min_ms, copy_bytes = 30.0, 4_000_000_000

    t_start = time.time()
    copy_bw = copy_bandwidth(copy_bytes)
    out = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
               python=platform.python_version(), quick=args.quick, copy_GBps=copy_bw / 1e9,
               checks={}, results=[], cublas=[], errors=[])
    for qtype in types:
        try:
            out["checks"][qtype.name] = check(qtype, 4096, 5120)
        except Exception as e:  # keep going: one failing type must not hide the others' numbers
            out["errors"].append(f"check {qtype.name}: {type(e).__name__}: {e}")
            traceback.print_exc()
    for n, k in shapes:
        for qtype in types:
            try:
                out["results"].append(bench_quant(qtype, n, k, ms, copy_bw, min_ms))
            except Exception as e:
                out["errors"].append(f"{qtype.name} {n}x{k}: {type(e).__name__}: {e}")
                traceback.print_exc()
            print(f"  done {qtype.name} {n}x{k} ({time.time() - t_start:.0f}s)", file=sys.stderr)
        try:
            out["cublas"].append(bench_cublas(n, k, ms, copy_bw, min_ms))
        except Exception as e:
            out["errors"].append(f"cublas {n}x{k}: {type(e).__name__}: {e}")
            traceback.print_exc()
    out["seconds"] = time.time() - t_start

    text = json.dumps(out, indent=1)
    print(text)
    if args.json_out:
        Path(args.json_out).write_text(text)

    print_table(out)
    return 1 if out["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
