"""Compile the small-M dot kernel (or a probe_dot.py mode) for a CUDA target on any machine -- no GPU needed --
and count what its main loop does in Triton's GPU IR (TTGIR): layout conversions, shared-memory allocations,
synchronous loads, cp.async copies (whole kernel), and dots; and, in the PTX it lowers to (whole kernel), the
instructions, barriers (bar.sync), shared-memory loads / stores and MMA instructions. Read the PTX counts before
the TTGIR ones: a TTGIR layout conversion of an index vector can lower to register moves, no shared memory
(the shipped loop's 22 conversions per step and the lean mode's 4 lower to the same 26 barriers).

    python benchmarks/ttgir_counts.py [--types Q4_K,Q6_K] [--modes shipped,full,lean,lean3] [--sm 90]
                                      [--dump DIR]

Modes: shipped (kernels._dot_kernel as dot_config launches it), shipped_w (its W_AS_A orientation: on sm_90
the weight tile is the first operand of a wgmma), mmq (kernels._mmq_kernel, the int8 tensor-core kernel, at
_MMQ_TILE), or any probe_dot.py mode.

The counts come from the local Triton, which may lower differently from the GPU machine's (triton 3.9 here
pipelines only the word tile; 3.6 on the H200 also pipelines the x tiles, probe_dot.py's own counts): read them
as what the source asks for, and time any change on the GPU before shipping it.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from gguf import GGMLQuantizationType as QT  # noqa: E402

from dflash24.quant import kernels as K  # noqa: E402
from dflash24.quant.packed import GEOMETRY  # noqa: E402

_INTS = {"M", "N", "NBLK", "NG", "s_xm", "s_qs", "s_qh", "s_sc", "s_d", "blocks_per_split", "groups_per_split"}


def signature(fn, q) -> dict:
    """Argument types of the dot kernel / probe kernel for weights of type q (bf16 activations)."""
    sig = {}
    for n in fn.arg_names:
        if n == "x_ptr":
            sig[n] = "*bf16"
        elif n == "xq_ptr":
            sig[n] = "*i8"
        elif n == "dx_ptr":
            sig[n] = "*fp32"
        elif n == "xs_ptr":
            sig[n] = "*i32"
        elif n in ("y_ptr", "b_ptr"):
            sig[n] = "*fp32"
        elif n in ("qs_ptr", "qh_ptr"):
            sig[n] = "*i32"
        elif n in ("sc_ptr", "mn_ptr"):
            sig[n] = "*i8" if q == QT.Q6_K else "*u8"
        elif n in ("d_ptr", "dm_ptr"):
            sig[n] = "*fp16"
        elif n in _INTS:
            sig[n] = "i32"
        else:
            sig[n] = "constexpr"
    return sig


def compile_kernel(q, mode: str, sm: int):
    bs, fpw = GEOMETRY[q]
    cfg_n = K._DOT_TILE.get(q, K._DOT_DEFAULT)[0]
    const = dict(QTYPE=K._CODE[q], BS=bs, FPW=fpw, BLOCK_M=16, BLOCK_N=cfg_n, G=256 // bs)
    if mode == "mmq":
        fn = K._mmq_kernel
        const = dict(QTYPE=K._CODE[q], BLOCK_M=16, BLOCK_N=K._MMQ_TILE[0], HAS_BIAS=False)
    elif mode in ("shipped", "shipped_w"):
        fn = K._dot_kernel
        const.update(UPCAST=False, HAS_BIAS=False, W_AS_A=mode == "shipped_w")
    else:
        import probe_dot
        fn = probe_dot._probe_kernel
        const.update(MODE=probe_dot.MODES[mode], STAGES=2)
    src = ASTSource(fn=fn, signature=signature(fn, q),
                    constexprs={(fn.arg_names.index(k),): v for k, v in const.items()})
    stages = 1 if mode == "mmq" else 2
    return triton.compile(src, target=GPUTarget("cuda", sm, 32), options={"num_warps": 4, "num_stages": stages})


def counts(ttgir: str) -> dict:
    loop = ttgir[ttgir.index("scf.for"):ttgir.index("scf.yield")]
    return {"convert_layout": loop.count("ttg.convert_layout"), "local_alloc": loop.count("ttg.local_alloc"),
            "sync_loads": loop.count("tt.load "), "dots": loop.count("tt.dot ") + loop.count("ttng.warp_group_dot "),
            "async_copies": ttgir.count("async_copy_global_to_local")}


def ptx_counts(ptx: str) -> dict:
    body = [ln.strip() for ln in ptx.split("\n")]
    instr = [ln for ln in body if ln and not ln.startswith(("//", "$", ".", "{", "}", "@$"))]
    return {"instructions": len(instr), "bar_sync": ptx.count("bar.sync"), "ld_shared": ptx.count("ld.shared"),
            "st_shared": ptx.count("st.shared"), "mma": ptx.count("mma.sync") + ptx.count("wgmma.mma_async")}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--types", default="Q4_K,Q6_K")
    ap.add_argument("--modes", default="shipped,lean,lean3")
    ap.add_argument("--sm", type=int, default=90)
    ap.add_argument("--dump", default=None, help="write each TTGIR here")
    args = ap.parse_args()
    for name in args.types.split(","):
        for mode in args.modes.split(","):
            asm = compile_kernel(QT[name], mode, args.sm).asm
            if args.dump:
                Path(args.dump).mkdir(parents=True, exist_ok=True)
                (Path(args.dump) / f"{name}_{mode}.ttgir").write_text(asm["ttgir"])
                (Path(args.dump) / f"{name}_{mode}.ptx").write_text(asm["ptx"])
            print(json.dumps({"type": name, "mode": mode, "sm": args.sm, "ttgir_main_loop": counts(asm["ttgir"]),
                              "ptx": ptx_counts(asm["ptx"])}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
