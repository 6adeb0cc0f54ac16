"""Compile the Gluon small-M matmul (quant/gluon_matmul.py `_kq_kernel`) for a CUDA target on any machine -- no GPU
needed -- exactly as `gluon_matmul.matmul` would launch it for a weight shape and a row count, and count what its
main loop issues: registers a thread, the loop's SASS instructions by opcode, local-memory traffic (spills), and
how far ahead its global loads are issued (ttgir_counts.sass_counts, with the cuobjdump that ships with Triton).

    python benchmarks/gluon_sass.py --type Q4_K --shape 17408x5120 --m 16 [--set STATEMENTS] [--sm 90] [--dump F]

--set: Python statements run first with G = dflash24.quant.gluon_matmul and QT in scope, e.g.
"G.DENORM_TILES.add((QT.Q4_K, 16)); G.NREG[(QT.Q4_K, 16)] = 128". Prints one JSON line: the launch config and the
counts. The counts depend on the Triton version (the GPU machine's may differ from this machine's): time any change
on the GPU before shipping it.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from gguf import GGMLQuantizationType as QT  # noqa: E402

from ttgir_counts import sass_counts  # noqa: E402

from dflash24.quant import gluon_matmul as G  # noqa: E402
from dflash24.quant.formats import random_raw  # noqa: E402
from dflash24.quant.packed import pack  # noqa: E402


def compile_matmul(qtype, n: int, k: int, m: int, sm: int = 90):
    """(launch config, CompiledKernel) of the `_kq_kernel` launch that `G.matmul` makes for an (n, k) weight of qtype
    and m rows of x, compiled for sm_<sm>. The launch is recorded, not run (the kernel's `run` is replaced), and bound
    by Triton's own binder for the target, so the specializations are a real launch's."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import make_backend
    from triton.experimental.gluon._runtime import GluonASTSource
    from triton.runtime import jit

    if not G.HAVE_GLUON:
        raise SystemExit("this triton has no Gluon")
    p = pack(random_raw(qtype, n, k), qtype, k)
    cfg = G.config(p, m, torch.device("cpu"))
    fn, seen = G._kq_kernel, {}

    def record(*args, grid, warmup, **kwargs):
        seen.update(args=args, kwargs=kwargs)

    fn.run, available = record, G.available
    G.available = lambda device: True
    try:
        x = torch.zeros(m, k, dtype=torch.bfloat16)
        G.matmul(x, p, cfg, x_order=x)
    except Exception:       # noqa: BLE001 - the wrapper's epilogue on the unfilled output may fail; the launch is seen
        if not seen:
            raise
    finally:
        G.available = available
        del fn.run
    kwargs = {k: v for k, v in seen["kwargs"].items() if k != "launch_pdl"}
    kwargs["debug"] = False
    target = GPUTarget("cuda", sm, 32)
    backend = make_backend(target)
    binder = jit.create_function_from_signature(fn.signature, fn.params, backend)
    bound, spec, opts = binder(*seen["args"], **kwargs)
    options, signature, constexprs, attrs = fn._pack_args(backend, kwargs, bound, spec, opts)
    return cfg, triton.compile(GluonASTSource(fn, signature, constexprs, attrs), target=target,
                               options=options.__dict__)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--type", default="Q4_K", help="the weight's GGUF type (gluon_matmul.TYPES)")
    ap.add_argument("--shape", default="17408x5120", help="N x K of the weight")
    ap.add_argument("--m", type=int, default=16, help="rows of x (the tile height follows: 16, 32 or 64)")
    ap.add_argument("--set", default="", help="statements run first (G = gluon_matmul, QT in scope)")
    ap.add_argument("--sm", type=int, default=90)
    ap.add_argument("--dump", default=None, help="write the SASS to this file")
    args = ap.parse_args()
    exec(args.set, {"G": G, "QT": QT})
    n, k = (int(v) for v in args.shape.split("x"))
    cfg, c = compile_matmul(QT[args.type], n, k, args.m, args.sm)
    import triton
    print(json.dumps({"type": args.type, "shape": args.shape, "m": args.m, "sm": args.sm, "set": args.set,
                      "triton": triton.__version__, "cfg": cfg, "shared_bytes": c.metadata.shared,
                      **sass_counts(c.asm["cubin"], Path(args.dump) if args.dump else None)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
