"""Compile the block-matmul kernels for a CUDA target on any machine -- no GPU needed -- and count what their main
loop does: in Triton's GPU IR (TTGIR), layout conversions, shared-memory allocations, synchronous loads (the
software pipeliner copies ahead with cp.async only loads of >= 4 bytes per thread) and dots, with the cp.async
copies of the whole kernel; in the PTX the loop lowers to, its instructions by opcode (the loop body between its
header label and the back branch); in the SASS ptxas makes of it (where the Triton install has cuobjdump), the
registers per thread and the loop's machine instructions by opcode.

    python benchmarks/ttgir_counts.py [--types Q4_K,Q6_K] [--modes dot,dot_w,dot_pairs,dot_w_pairs,gemv,gemv_pair,mmq]
                                      [--words 0,1,2,3] [--sm 90] [--pdl] [--xperm] [--unroll U] [--dump DIR]

Modes: dot (kernels._dot_kernel at M = 16 as dot_config launches it), dot_w (its W_AS_A orientation: on sm_90 the
weight tile is the first operand of a wgmma), dot_pairs / dot_w_pairs (either with the PAIRS decode: Q4_0, Q5_0,
Q4_K, Q5_K, Q6_K), gemv (kernels._gemv_int8_kernel at _GEMV_TILE), gemv_pair (the same with ROW_PAIR where the
tile has 2 rows), mmq (the int8 tensor-core kernel at _MMQ_TILE).
--words: the `_load_scales` WORDS variants to compile (dot / gemv).
The kernels are specialized as a launch on the GPU would be at N = 17408, K = 5120 (pointers and the strides that
are multiples of 16 marked divisible by 16), which decides which loads are vectorized and pipelined.

The counts depend on the Triton version: compile with the GPU machine's (3.6.0 on the H200 this project uses:
`pip install --target DIR triton==3.6.0` and PYTHONPATH=DIR), and time any change on the GPU before shipping it.
"""
from __future__ import annotations

import argparse
import collections
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from gguf import GGMLQuantizationType as QT  # noqa: E402

from dflash24.quant import kernels as K  # noqa: E402
from dflash24.quant.packed import GEOMETRY  # noqa: E402

N, KDIM = 17408, 5120


def _ints(q, kdim: int = KDIM) -> dict:
    bs, _ = GEOMETRY[q]
    return dict(M=16, N=N, NBLK=kdim // bs, NG=kdim // 32, s_xm=kdim, s_qs=kdim // (4 if q == QT.Q8_0 else 8),
                s_qh=kdim // (16 if q == QT.Q6_K else 8), s_sc=kdim // bs,
                s_d=kdim // (256 if q in (QT.Q4_K, QT.Q5_K, QT.Q6_K) else 32), blocks_per_split=64,
                groups_per_split=64)


def _pointer_type(n: str, q) -> str:
    if n == "x_ptr":
        return "*bf16"
    if n == "xq_ptr":
        return "*i8"
    if n in ("dx_ptr", "y_ptr", "b_ptr"):
        return "*fp32"
    if n in ("xs_ptr", "xw_ptr", "qs_ptr", "qh_ptr"):
        return "*i32"
    if n in ("sc_ptr", "mn_ptr"):
        return "*i8" if q == QT.Q6_K else "*u8"
    return "*fp16"                                                   # d_ptr, dm_ptr


def compile_kernel(q, mode: str, words: int, sm: int, pdl: bool = False, xperm: bool = False, unroll: int = 1,
                   block_m: int = 16, block_n: int = 0, warps: int = 4, maxnreg: int = 0, stream: bool = False,
                   stages: int = 2, prefetch: int = 0, g: int = 0, kdim: int = KDIM, whole: bool = False):
    bs, fpw = GEOMETRY[q]
    if mode == "mmq":
        fn = K._mmq_kernel
        const = dict(QTYPE=K._CODE[q], BLOCK_M=16, BLOCK_N=K._MMQ_TILE[0], HAS_BIAS=False)
        opts = {"num_warps": K._MMQ_TILE[1], "num_stages": 1}
    elif mode in ("gemv", "gemv_pair"):
        fn = K._gemv_int8_kernel
        bn, g_tile, warps, stages = K._GEMV_TILE[q]
        const = dict(QTYPE=K._CODE[q], BS=bs, FPW=fpw, BLOCK_N=bn, G=g or g_tile, STAGES=stages, INTERP=False,
                     HAS_BIAS=False, SCALE_WORDS=words,
                     ROW_RUN=q in K._GEMV_ROW_RUN, ROW_PAIR=bn == 2 and (q in K._GEMV_ROW_PAIR or mode == "gemv_pair"),
                     UNROLL=unroll, PREFETCH=prefetch, WHOLE=whole)
        opts = {"num_warps": warps, **({"maxnreg": maxnreg} if maxnreg else {})}
    else:
        fn = K._dot_kernel
        const = dict(QTYPE=K._CODE[q], BS=bs, FPW=fpw, BLOCK_M=block_m,
                     BLOCK_N=block_n or K._DOT_TILE.get(q, K._DOT_DEFAULT)[0],
                     G=256 // bs, UPCAST=False, HAS_BIAS=False, W_AS_A=mode.startswith("dot_w"), SCALE_WORDS=words,
                     ROW_RUN=True,
                     PAIRS=((4 if K.PAIRS_FIELD and q == QT.Q4_K else 3 if block_m >= K._PAIRS_LOP3_FROM else 1)
                            if mode.endswith("_pairs") else 0),
                     XPERM=xperm and mode.endswith("_pairs"), STREAM=stream)
        opts = {"num_warps": warps, "num_stages": stages, **({"maxnreg": maxnreg} if maxnreg else {})}
    const["PDL"] = pdl                   # a constexpr with a default: passed, or it would compile as an i32 argument
    ints = _ints(q, kdim)
    sig, attrs = {}, {}
    for i, n in enumerate(fn.arg_names):
        if n in const:
            sig[n] = "constexpr"
        elif n.endswith("_ptr"):
            sig[n] = _pointer_type(n, q)
            attrs[(i,)] = [["tt.divisibility", 16]]
        else:
            sig[n] = "i32"
            if ints.get(n, 1) % 16 == 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
    src = ASTSource(fn=fn, signature=sig, constexprs={(fn.arg_names.index(k),): v for k, v in const.items()},
                    attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", sm, 32), options=opts)


def ttgir_counts(ttgir: str) -> dict:
    loop = ttgir[ttgir.index("scf.for"):ttgir.index("scf.yield")]
    return {"convert_layout": loop.count("ttg.convert_layout"), "local_alloc": loop.count("ttg.local_alloc"),
            "sync_loads": loop.count("tt.load "), "dots": loop.count("tt.dot ") + loop.count("ttng.warp_group_dot "),
            "async_copies": ttgir.count("async_copy_global_to_local")}


def loop_ptx_counts(ptx: str) -> dict:
    """Instructions of the longest loop (a label and a later branch back to it), by opcode."""
    lines = ptx.split("\n")
    labels = {m.group(1): i for i, ln in enumerate(lines) if (m := re.match(r"^(\$L__BB\d+_\d+):", ln.strip()))}
    span = (0, 0)
    for i, ln in enumerate(lines):
        m = re.search(r"bra(?:\.uni)?\s+(\$L__BB\d+_\d+);", ln)
        if m and labels.get(m.group(1), i) < i and i - labels[m.group(1)] > span[1] - span[0]:
            span = (labels[m.group(1)], i)
    body = [ln.strip() for ln in lines[span[0]:span[1] + 1]]
    ops = [re.sub(r"^@!?%p\d+\s+", "", ln).split()[0].split(".")[0] for ln in body
           if ln and not ln.startswith(("//", "$", "{", "}", "."))]
    return {"instructions": len(ops), "by_opcode": dict(collections.Counter(ops).most_common(12))}


def sass_counts(cubin: bytes, dump: Path | None = None) -> dict:
    """Registers per thread and the longest loop's SASS instructions by opcode, from the cubin (cuobjdump of the
    Triton install's CUDA tools; {} where it has none). What ptxas made of the PTX: its counts, not the PTX's, are
    what the SMs issue (it fuses and/or into LOP3, drops moves, and may hoist constants). dump: write the SASS there."""
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    if not tool.exists():
        return {}
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        sass = subprocess.run([str(tool), "-sass", f.name], capture_output=True, text=True).stdout
        res = subprocess.run([str(tool), "-res-usage", f.name], capture_output=True, text=True).stdout
    if dump is not None:
        dump.write_text(sass)
    ops = []
    for ln in sass.split("\n"):
        m = re.match(r"\s+/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_.]+)([^;]*)", ln)
        if m:
            ops.append((int(m.group(1), 16), m.group(2), m.group(3)))
    span = (0, -1)
    for addr, op, rest in ops:                      # the longest backward branch: the main loop
        m = re.search(r"0x([0-9a-f]+)", rest) if op.startswith("BRA") else None
        if m and int(m.group(1), 16) < addr and addr - int(m.group(1), 16) > span[1] - span[0]:
            span = (int(m.group(1), 16), addr)
    loop = [(op, rest) for addr, op, rest in ops if span[0] <= addr <= span[1]]
    body = [op.split(".")[0] for op, _ in loop]
    regs = re.findall(r"REG:(\d+)", res)
    return {"registers": int(regs[0]) if regs else None,
            "sass_main_loop": {"instructions": len(body), "by_opcode": dict(collections.Counter(body).most_common(12)),
                               "local_memory": sum(op in ("LDL", "STL") for op in body),
                               # data moved between a warp's threads or through shared memory by the threads
                               "shared_and_shuffles": sum(op in ("LDS", "STS", "LDSM", "SHFL") for op in body),
                               **global_loads_in_flight(loop)}}


def global_loads_in_flight(loop: list[tuple[str, str]]) -> dict:
    """How far ahead of their use the loop's global loads are issued: each LDG counted from its issue to the first
    instruction after it (around the loop) that reads one of its destination registers. Returns the mean number of
    LDGs in flight over the loop's instructions, the LDGs a trip, and the mean / least distance in instructions
    (for a loop of S steps, in-flight LDGs / (LDGs a trip / S) is how many steps of loads are in flight)."""
    n = len(loop)
    spans = []
    for i, (op, rest) in enumerate(loop):
        m = re.match(r"\s*R(\d+)", rest) if op.startswith("LDG") else None
        if not m:
            continue
        width = 4 if ".128" in op else 2 if ".64" in op else 1
        dst = set(range(int(m.group(1)), int(m.group(1)) + width))
        for d in range(1, n + 1):
            src = loop[(i + d) % n][1].split(",", 1)
            if len(src) > 1 and dst & {int(r) for r in re.findall(r"\bR(\d+)", src[1])}:
                spans.append(d)
                break
    if not spans:
        return {}
    return {"ldg_a_trip": len(spans), "ldg_in_flight_mean": round(sum(spans) / n, 1),
            "ldg_distance_mean": round(sum(spans) / len(spans), 1), "ldg_distance_min": min(spans)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--types", default="Q4_K,Q6_K")
    ap.add_argument("--modes", default="dot,gemv")
    ap.add_argument("--words", default="0", help="_load_scales WORDS variants, e.g. 0,1,2,3")
    ap.add_argument("--sm", type=int, default=90)
    ap.add_argument("--dump", default=None, help="write each TTGIR and PTX here")
    ap.add_argument("--pdl", action="store_true", help="the kernels as DFLASH24_PDL=1 launches them (kernels/pdl.py)")
    ap.add_argument("--xperm", action="store_true", help="the _pairs modes reading x in pair order (as a verify does)")
    ap.add_argument("--unroll", type=int, default=1, help="the GEMV's loop_unroll_factor (UNROLL)")
    ap.add_argument("--block-m", type=int, default=16, help="the dot modes' BLOCK_M (16: a chain verify, 32: a tree)")
    ap.add_argument("--block-n", type=int, default=0, help="the dot modes' BLOCK_N (0: the type's _DOT_TILE)")
    ap.add_argument("--warps", type=int, default=4, help="the dot modes' num_warps")
    ap.add_argument("--maxnreg", type=int, default=0, help="the register cap (ptxas .maxnreg; 0: none)")
    ap.add_argument("--stream", action="store_true", help="the dot modes' STREAM split (kernels.stream_split)")
    ap.add_argument("--stages", type=int, default=2, help="the dot modes' num_stages (cp.async ring depth)")
    ap.add_argument("--prefetch", action="store_true", help="the GEMV modes' next-step register prefetch")
    ap.add_argument("--ahead", type=int, default=1, help="with --prefetch --whole: steps loaded ahead (1 or 2)")
    ap.add_argument("--whole", action="store_true", help="the GEMV modes on whole steps (no masked loads)")
    ap.add_argument("--g", type=int, default=0, help="the GEMV modes' G (0: the type's _GEMV_TILE)")
    ap.add_argument("--k", type=int, default=KDIM, help="K the kernels are specialized for (strides, block counts)")
    args = ap.parse_args()
    for name in args.types.split(","):
        for mode in args.modes.split(","):
            for words in ([0] if mode == "mmq" else [int(w) for w in args.words.split(",")]):
                c = compile_kernel(QT[name], mode, words, args.sm, args.pdl, args.xperm, args.unroll,
                                   args.block_m, args.block_n, args.warps, args.maxnreg, args.stream,
                                   args.stages, args.ahead if args.prefetch else 0, args.g, args.k, args.whole)
                if args.dump:
                    Path(args.dump).mkdir(parents=True, exist_ok=True)
                    for ext in ("ttgir", "ptx"):
                        (Path(args.dump) / f"{name}_{mode}_w{words}.{ext}").write_text(c.asm[ext])
                print(json.dumps({"type": name, "mode": mode, "words": words, "sm": args.sm, "block_m": args.block_m,
                                  "block_n": args.block_n or None, "warps": args.warps,
                                  "maxnreg": args.maxnreg or None, "stream": args.stream, "stages": args.stages,
                                  "prefetch": args.ahead if args.prefetch else 0, "whole": args.whole,
                                  "g": args.g or None, "k": args.k,
                                  "triton": triton.__version__, "shared_bytes": c.metadata.shared,
                                  "ttgir_main_loop": ttgir_counts(c.asm["ttgir"]),
                                  "ptx_main_loop": loop_ptx_counts(c.asm["ptx"]),
                                  **sass_counts(c.asm["cubin"], Path(args.dump) / f"{name}_{mode}_w{words}.sass"
                                                if args.dump else None)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
