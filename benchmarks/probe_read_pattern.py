"""Is the ffn_down GEMV's loss on the H200 its access pattern? Reads of the same bytes in three orders, no
arithmetic, on a CUDA GPU:

    python benchmarks/probe_read_pattern.py [--shapes 5120x17408,34816x5120] [--min-ms 10]

A packed Q4_K weight's code plane is N rows of K / 2 bytes. The row-pair GEMV (kernels._gemv_int8_kernel, ROW_PAIR)
gives each one-warp program two neighbouring rows and walks them step by step: a step is 512 bytes of each row
(1,024 weights), so the 5120 x 17408 ffn_down has 2,560 programs reading 5,120 rows side by side, 512 bytes a row
at a time, each program in its own 17 KB; a 34816 x 5120 weight reads 2.5 KB rows in 5 steps. Timed here, on the
same bytes with the same one-warp programs and the same loop (a step's (2, 128) int32 tile loaded,
xor-accumulated), in three layouts of the plane:
- `rows`: row-major, as packed (program p: rows 2 p, 2 p + 1; step s: words 128 s .. 128 s + 127 of each);
- `pairs`: each program's steps one after another (step s its s-th KB): one 1 KB run a step instead of two 512 B
  runs 8.7 KB apart (the same 17 KB a program);
- `steps`: step-major (step s of every row together): programs that run in step read one contiguous region;
- `chunks`: 16 KiB contiguous a program (probe_gemv_chain's plain read), the lower bound of a launch.
The layouts' reads run the same plain loop (num_stages 1, as the GEMV's). The compiler unrolls it four times (SASS
for sm_90, triton 3.9: 8 LDG.128 a trip, all issued before the first xor), so a warp keeps 4 steps (4 KB) in flight
in every layout, more than the GEMV does (one step ahead): the layouts compare with each other, not with the GEMV.
Prints one JSON line per shape: us and fraction of the copy bandwidth measured in the same run. `rows` well below
`steps` or `pairs` says the order of the bytes, not the GEMV's arithmetic or its loads in flight, is what ffn_down
loses, and which layout would win it back.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

STEP_WORDS = 128            # int32 words of a row a step: 1,024 Q4_K codes (the GEMV's G = 32 blocks)


ORDERS = {"rows": 0, "pairs": 1, "steps": 2}


@triton.jit
def _pattern_kernel(src_ptr, out_ptr, n_rows, row_words, ORDER: tl.constexpr, STEP: tl.constexpr):
    """out[pid] = xor of program pid's two rows' words, a (2, STEP) tile a step, the plane laid out as ORDER says
    (`ORDERS`, `offsets`)."""
    pid = tl.program_id(0).to(tl.int64)
    i = tl.arange(0, 2)[:, None]
    j = tl.arange(0, STEP)[None, :]
    acc = tl.zeros((2, STEP), tl.int32)
    for s in range(0, row_words // STEP):
        if ORDER == 0:
            offs = (2 * pid + i) * row_words + s * STEP + j
        elif ORDER == 1:
            offs = pid * 2 * row_words + s * 2 * STEP + i * STEP + j
        else:
            offs = s * n_rows * STEP + (2 * pid + i) * STEP + j
        acc ^= tl.load(src_ptr + offs)
    tl.store(out_ptr + pid, tl.xor_sum(tl.xor_sum(acc, 1), 0))


def offsets(n: int, row_words: int, order: str) -> torch.Tensor:
    """(n // 2, 2 row_words) int64: the words program p reads, as `_pattern_kernel` addresses them."""
    p = torch.arange(n // 2)[:, None, None, None]
    s = torch.arange(row_words // STEP_WORDS)[None, :, None, None]
    i = torch.arange(2)[None, None, :, None]
    j = torch.arange(STEP_WORDS)[None, None, None, :]
    if order == "rows":
        o = (2 * p + i) * row_words + s * STEP_WORDS + j
    elif order == "pairs":
        o = p * 2 * row_words + s * 2 * STEP_WORDS + i * STEP_WORDS + j
    else:
        o = s * n * STEP_WORDS + (2 * p + i) * STEP_WORDS + j
    return o.reshape(n // 2, -1)


@triton.jit
def _chunk_kernel(src_ptr, out_ptr, PER: tl.constexpr, BLOCK: tl.constexpr):
    """out[pid] = xor of the PER contiguous words of program pid (PER a multiple of BLOCK)."""
    base = tl.program_id(0).to(tl.int64) * PER
    acc = tl.zeros((BLOCK,), tl.int32)
    for i in tl.static_range(PER // BLOCK):
        acc ^= tl.load(src_ptr + base + i * BLOCK + tl.arange(0, BLOCK))
    tl.store(out_ptr + tl.program_id(0), tl.xor_sum(acc, 0))


def read_rows(src: torch.Tensor, out: torch.Tensor, n: int, row_words: int, order: str) -> None:
    """One launch of `_pattern_kernel` over src holding n rows of row_words words (n even, row_words a multiple of
    STEP_WORDS) in `order`'s layout; out: (n // 2,) int32."""
    if n % 2 or row_words % STEP_WORDS or order not in ORDERS:
        raise ValueError(f"read_rows: n even, row_words a multiple of {STEP_WORDS}, order one of {list(ORDERS)}; "
                         f"got {n}, {row_words}, {order!r}")
    _pattern_kernel[(n // 2,)](src, out, n, row_words, ORDER=ORDERS[order], STEP=STEP_WORDS, num_warps=1,
                               num_stages=1)


def read_chunks(src: torch.Tensor, out: torch.Tensor, per: int = 4096) -> None:
    """One launch of `_chunk_kernel`: per words (16 KiB) a program; per a multiple of 1024, src.numel() of per."""
    if per % 1024 or src.numel() % per:
        raise ValueError(f"read_chunks: per a multiple of 1024 and of it src's size, got {per}, {src.numel()}")
    _chunk_kernel[(src.numel() // per,)](src, out, PER=per, BLOCK=1024, num_warps=4, num_stages=1)


def reference(src: torch.Tensor, n: int, row_words: int, order: str) -> torch.Tensor:
    """What `read_rows` writes, in PyTorch: each program's xor over the words `offsets` gives it."""
    w = src[offsets(n, row_words, order)]
    acc = torch.zeros(n // 2, dtype=torch.int32, device=src.device)
    for c in range(w.shape[1]):
        acc ^= w[:, c]
    return acc


def main() -> int:
    from bench_gemv import L2_FLUSH_BYTES, copy_bandwidth, time_graph
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="5120x17408,34816x5120", help="N x K of Q4_K weights (code planes read)")
    ap.add_argument("--min-ms", type=float, default=10.0)
    args = ap.parse_args()
    bw = copy_bandwidth(2 << 30)
    print(json.dumps({"copy_GBps": round(bw / 1e9, 1), "device": torch.cuda.get_device_name()}), flush=True)
    for shape in args.shapes.split(","):
        n, k = (int(v) for v in shape.split("x"))
        row_words = k // 8                                    # 4-bit codes: K / 2 bytes a row
        nbytes = n * row_words * 4
        copies = [torch.randint(-2**31, 2**31 - 1, (n * row_words,), dtype=torch.int32, device="cuda")
                  for _ in range(max(2, -(-L2_FLUSH_BYTES // nbytes)))]
        out = torch.empty(max(n // 2, n * row_words // 4096 + 1), dtype=torch.int32, device="cuda")
        row = {"N": n, "K": k, "MB": round(nbytes / 1e6, 2)}
        fns = {o: (lambda c, o=o: read_rows(c, out, n, row_words, o)) for o in ORDERS}
        fns["chunks"] = lambda c: read_chunks(c[: c.numel() // 4096 * 4096], out)
        for name, fn in fns.items():
            t = time_graph([lambda c=c, fn=fn: fn(c) for c in copies], min_ms=args.min_ms)
            row[name] = [round(t * 1e6, 2), round(nbytes / t / bw, 3)]
        print(json.dumps(row), flush=True)
        del copies
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
