"""Where a quantized step's time goes by side: the 27B's attention step (24 / 4 heads of 256) over K and V of
different types, one side quantized at a time, by context and split count (CUDA GPU).

    python benchmarks/probe_kv_sides.py [--pairs q4_0:q4_0,q4_0:bf16,bf16:q4_0] [--steps 1,16] [--ctx 4096,32768]
                                        [--splits 1,4,16]

Prints a line per case: K type, V type, T, context, split count (auto: the engine's pick), microseconds (the
median of bench_attention.time_graph's CUDA-graph replays over enough cache copies to leave L2). --device cpu runs
each case once in Triton's interpreter (tiny shapes; for the tests) and prints "ran". --lmem-resize-to-max sets the
CUDA primary context's CU_CTX_LMEM_RESIZE_TO_MAX flag before anything starts CUDA: a kernel that spills to local
memory then keeps the driver's local-memory pool at its size instead of having it shrunk and grown around launches.
"""
from __future__ import annotations

import argparse
import ctypes
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_attention import cache_copies, make_cache, row_bytes, time_graph  # noqa: E402
from dflash24.cache import kvquant  # noqa: E402
from dflash24.kernels import attention as A  # noqa: E402


def lmem_resize_to_max() -> None:
    """CU_CTX_LMEM_RESIZE_TO_MAX (0x10) on device 0's primary context, through the driver API, before torch makes it."""
    cu = ctypes.CDLL("libcuda.so.1")
    dev = ctypes.c_int()
    for name, call in (("cuInit", lambda: cu.cuInit(0)), ("cuDeviceGet", lambda: cu.cuDeviceGet(ctypes.byref(dev), 0)),
                       ("cuDevicePrimaryCtxSetFlags", lambda: cu.cuDevicePrimaryCtxSetFlags(dev, 0x10))):
        rc = call()
        if rc:
            raise RuntimeError(f"{name} failed: CUresult {rc}")


def measure(fns, dev: str) -> str:
    """Microseconds a call of `fns` (CUDA-graph replays, `time_graph`), or on the CPU "ran" once each gave a finite
    output."""
    if dev == "cuda":
        return f"{time_graph(fns) * 1e6:.1f}"
    return "ran" if all(f().isfinite().all() for f in fns) else "non-finite output"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", default="q4_0:q4_0,q4_0:bf16,bf16:q4_0,q8_0:q8_0,q8_0:bf16,bf16:q8_0,bf16:bf16")
    ap.add_argument("--steps", default="1,16")
    ap.add_argument("--ctx", default="4096,32768")
    ap.add_argument("--splits", default="", help="also these split counts (comma-separated) for T > 1")
    ap.add_argument("--heads", type=int, default=24)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--head-dim", type=int, default=256)
    ap.add_argument("--device", default="cuda", help="cuda (timed); cpu only runs the cases (Triton's interpreter)")
    ap.add_argument("--lmem-resize-to-max", action="store_true", help="see the module's docstring")
    ap.add_argument("--rotations", action="store_true",
                    help="also time a tq3 side's host rotations alone: q rotated (K tq3), the output rotated back (V)")
    args = ap.parse_args(argv)
    if args.lmem_resize_to_max:
        lmem_resize_to_max()
    H, Hk, D, dev = args.heads, args.kv_heads, args.head_dim, args.device
    gen = torch.Generator().manual_seed(0)
    for pair in args.pairs.split(","):
        kt, vt = pair.split(":")
        for ctx in (int(c) for c in args.ctx.split(",")):
            kv_bytes = ctx * Hk * (row_bytes(kt, D) + row_bytes(vt, D))
            caches = [(make_cache(kt, ctx, Hk, D, dev), make_cache(vt, ctx, Hk, D, dev))
                      for _ in range(cache_copies(kv_bytes))]
            for T in (int(t) for t in args.steps.split(",")):
                q = torch.randn(T, H, D, generator=gen).to(dev, torch.bfloat16)
                slots = torch.arange(ctx - T, ctx, device=dev)
                splits = [None] + ([int(s) for s in args.splits.split(",")] if args.splits and T > 1 else [])
                for n in splits:
                    fns = [lambda k=k, v=v: A.attention(q, k, v, D ** -0.5, ctx, slots=slots, n_splits=n)
                           for k, v in caches]
                    try:
                        us = measure(fns, dev)
                    except Exception as e:  # noqa: BLE001
                        us = f"{type(e).__name__}: {e}"[:120]
                    print(kt, vt, T, ctx, n or "auto", us, flush=True)
            del caches
            if dev == "cuda":
                torch.cuda.empty_cache()
    if args.rotations:     # what `A.attention` runs around the kernel for a tq3 K (q) / V (its fp32 output)
        for T in (int(t) for t in args.steps.split(",")):
            q = torch.randn(T, H, D, generator=gen).to(dev, torch.bfloat16)
            out = torch.randn(T, H, D, generator=gen).to(dev)
            cases = [("rotate q (torch ops)", lambda: kvquant.rotate(q).contiguous()),
                     ("rotate output back (torch ops)", lambda: kvquant.rotate(out, inverse=True).to(torch.bfloat16))]
            if hasattr(A, "rotate_groups"):     # one launch each (absent in a tree from before it)
                cases += [("rotate q (rotate_groups)", lambda: A.rotate_groups(q)),
                          ("rotate output back (rotate_groups)",
                           lambda: A.rotate_groups(out, inverse=True, out_dtype=torch.bfloat16))]
            for name, fn in cases:
                print(name, T, measure([fn], dev), flush=True)


if __name__ == "__main__":
    main()
