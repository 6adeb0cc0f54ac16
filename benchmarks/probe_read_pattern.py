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

Where Gluon is available, the `rows` read also runs with its steps copied into a ring of S steps in shared memory,
S - 1 steps ahead of their use, one warp a program as above: `ringS` by cp.async (16 bytes a lane, through the SM's
load path, as the GEMV's loads), `tmaS` by the Hopper TMA unit (one 1 KB box a step, an mbarrier a slot; sm_90
only); `tdescS`: the same boxes as tensor-descriptor loads in a plain Triton loop of num_stages S (sm_90: Triton
makes them TMA copies itself). Why: the GEMV runs about 19 one-warp programs an SM on ffn_down, each keeping about a
step (1.1-1.7 KB) in flight in registers, and reads 0.67-0.78 of the copy bandwidth there on an H200 (Q4_K 17.8 us,
Q6_K 22.2 us, `part118`) against 0.80-0.88 on an H100. Its SASS says it is not bound by issue (Q6_K: 350
instructions a 128-weight trip a thread, so 7.3 us of issue for ffn_down's 89 M weights on 132 SMs at 1.98 GHz).
Little's law: at the same latency the H200's bandwidth needs about 1.4x the bytes in flight an H100's does. So: how
much do deeper async copies reach with the same programs? Each variant's xor is checked against the reference on the
first copy (`ok`).

Measured on an H200 (2026-12-06, BENCHMARKS.md): `rows` reads 0.868 of the copy bandwidth at 5120 x 17408 and no
ring reads faster (cp.async 0.851-0.871, TMA 0.774-0.851, Triton-pipelined descriptors 0.729-0.854), so the bytes in
flight are not what ffn_down's GEMVs (0.79 / 0.82) lose.
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

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import async_copy
    from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma
    _barrier = getattr(gl, "thread_barrier", None) or gl.barrier
    _async_load = getattr(async_copy, "async_load", None) or async_copy.async_copy_global_to_shared
    _tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared     # renamed in triton 3.9
    HAVE_GLUON = True
except ImportError:
    HAVE_GLUON = False

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


@triton.jit
def _tdesc_kernel(desc, out_ptr, row_words, STEP: tl.constexpr, STAGES: tl.constexpr):
    """The `rows` read with each step's (2, STEP) tile a tensor-descriptor load in a loop Triton pipelines
    STAGES deep (on sm_90: TMA copies into shared memory, an mbarrier a slot)."""
    pid = tl.program_id(0)
    acc = tl.zeros((2, STEP), tl.int32)
    for s in tl.range(0, row_words // STEP, num_stages=STAGES):
        acc ^= desc.load([2 * pid, s * STEP])
    tl.store(out_ptr + pid, tl.xor_sum(tl.xor_sum(acc, 1), 0))


def read_tdesc(desc, out: torch.Tensor, n: int, row_words: int, stages: int) -> None:
    """One launch of `_tdesc_kernel` on desc (`triton_descriptor`); as read_rows."""
    if n % 2 or row_words % STEP_WORDS or stages < 1:
        raise ValueError(f"read_tdesc: n even, row_words a multiple of {STEP_WORDS}, 1+ stages; got {n}, "
                         f"{row_words}, {stages}")
    _tdesc_kernel[(n // 2,)](desc, out, row_words, STEP=STEP_WORDS, STAGES=stages, num_warps=1, num_stages=stages)


def triton_descriptor(src: torch.Tensor, n: int, row_words: int):
    """src as n rows of row_words int32 words, (2, STEP_WORDS) boxes, for `_tdesc_kernel`."""
    from triton.tools.tensor_descriptor import TensorDescriptor
    return TensorDescriptor.from_tensor(src.view(n, row_words), [2, STEP_WORDS])


if HAVE_GLUON:

    @gluon.jit
    def _ring_kernel(src_ptr, out_ptr, row_words, S: gl.constexpr, STEP: gl.constexpr, L: gl.constexpr,
                     SL: gl.constexpr):
        """`_pattern_kernel`'s `rows` read, each step's (2, STEP) tile cp.async-copied into a ring of S slots in
        shared memory S - 1 steps before it is xor-ed (masked copies past the last step fill zeros)."""
        pid = gl.program_id(0).to(gl.int64)
        i = gl.arange(0, 2, layout=gl.SliceLayout(1, L))
        j = gl.arange(0, STEP, layout=gl.SliceLayout(0, L))
        ptrs = src_ptr + gl.expand_dims((2 * pid + i) * row_words, 1) + gl.expand_dims(j, 0)
        full = gl.expand_dims(i >= 0, 1) & gl.expand_dims(j >= 0, 0)
        n_steps = row_words // STEP
        ring = gl.allocate_shared_memory(gl.int32, [S, 2, STEP], SL)
        for t in gl.static_range(S - 1):
            _async_load(ring.index(t), ptrs + t * STEP, mask=full & (t < n_steps))
            async_copy.commit_group()
        acc = gl.zeros([2, STEP], gl.int32, L)
        for s in range(0, n_steps):
            nxt = s + S - 1                            # into the slot step s - 1 left
            _barrier()
            _async_load(ring.index(nxt % S), ptrs + nxt * STEP, mask=full & (nxt < n_steps))
            async_copy.commit_group()
            async_copy.wait_group(S - 1)               # step s's copy done
            acc ^= ring.index(s % S).load(L)
        async_copy.wait_group(0)
        gl.store(out_ptr + pid, gl.xor_sum(gl.xor_sum(acc, 1), 0))

    @gluon.jit
    def _tma_kernel(desc, out_ptr, row_words, S: gl.constexpr, STEP: gl.constexpr, L: gl.constexpr):
        """The same read, each step's (2, STEP) box copied by the TMA unit into a ring of S slots (one mbarrier a
        slot) S - 1 steps before it is xor-ed."""
        pid = gl.program_id(0)
        n_steps = row_words // STEP
        ring = gl.allocate_shared_memory(gl.int32, [S, 2, STEP], desc.layout)
        bars = gl.allocate_shared_memory(gl.int64, [S, 1], mbarrier.MBarrierLayout())
        for t in gl.static_range(S):
            mbarrier.init(bars.index(t), count=1)
        for t in gl.static_range(S - 1):
            mbarrier.expect(bars.index(t), 2 * STEP * 4, pred=t < n_steps)
            _tma_load(desc, [2 * pid, t * STEP], bars.index(t), ring.index(t),
                      pred=t < n_steps)
        acc = gl.zeros([2, STEP], gl.int32, L)
        for s in range(0, n_steps):
            nxt = s + S - 1
            _barrier()                                 # every lane done with the slot step s - 1 left
            mbarrier.expect(bars.index(nxt % S), 2 * STEP * 4, pred=nxt < n_steps)
            _tma_load(desc, [2 * pid, nxt * STEP], bars.index(nxt % S), ring.index(nxt % S),
                      pred=nxt < n_steps)
            mbarrier.wait(bars.index(s % S), (s // S) & 1)
            acc ^= ring.index(s % S).load(L)
        for t in gl.static_range(S):
            mbarrier.invalidate(bars.index(t))
        gl.store(out_ptr + pid, gl.xor_sum(gl.xor_sum(acc, 1), 0))


def gluon_layouts() -> dict:
    """The Gluon kernels' register layout of a step's (2, STEP) tile (16 bytes a lane a row, one warp) and the
    cp.async ring's shared layout."""
    return dict(L=gl.BlockedLayout([1, 4], [1, 32], [1, 1], [1, 0]), SL=gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))


def tma_layout():
    return gl.NVMMASharedLayout.get_default_for([2, STEP_WORDS], gl.int32)


def read_ring(src: torch.Tensor, out: torch.Tensor, n: int, row_words: int, slots: int) -> None:
    """One launch of `_ring_kernel` (the `rows` layout, `slots` steps in shared memory); as read_rows."""
    if n % 2 or row_words % STEP_WORDS or slots < 2:
        raise ValueError(f"read_ring: n even, row_words a multiple of {STEP_WORDS}, 2+ slots; got {n}, {row_words}, "
                         f"{slots}")
    _ring_kernel[(n // 2,)](src, out, row_words, S=slots, STEP=STEP_WORDS, **gluon_layouts(), num_warps=1)


def tma_descriptor(src: torch.Tensor, n: int, row_words: int):
    """The TMA descriptor of src as n rows of row_words int32 words, (2, STEP_WORDS) boxes."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    return TensorDescriptor.from_tensor(src.view(n, row_words), [2, STEP_WORDS], tma_layout())


def read_tma(desc, out: torch.Tensor, n: int, row_words: int, slots: int) -> None:
    """One launch of `_tma_kernel` on `tma_descriptor`'s desc; as read_rows (sm_90+)."""
    if n % 2 or row_words % STEP_WORDS or slots < 2:
        raise ValueError(f"read_tma: n even, row_words a multiple of {STEP_WORDS}, 2+ slots; got {n}, {row_words}, "
                         f"{slots}")
    _tma_kernel[(n // 2,)](desc, out, row_words, S=slots, STEP=STEP_WORDS, L=gluon_layouts()["L"], num_warps=1)


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
    ap.add_argument("--slots", type=lambda v: [int(x) for x in v.split(",")], default=[2, 4, 8],
                    help="ring depths of the Gluon reads (steps in shared memory)")
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
        checked = set()               # the ring / descriptor reads: each one's xor checked against `want`
        want = reference(copies[0], n, row_words, "rows")
        hopper = torch.cuda.get_device_capability()[0] >= 9        # the TMA unit
        if hopper:
            tdescs = {c.data_ptr(): triton_descriptor(c, n, row_words) for c in copies}
            for slots in args.slots:
                fns[f"tdesc{slots}"] = lambda c, s=slots: read_tdesc(tdescs[c.data_ptr()], out, n, row_words, s)
                checked.add(f"tdesc{slots}")
        if HAVE_GLUON:
            for slots in args.slots:
                fns[f"ring{slots}"] = lambda c, s=slots: read_ring(c, out, n, row_words, s)
                checked.add(f"ring{slots}")
            if hopper:
                try:
                    descs = {c.data_ptr(): tma_descriptor(c, n, row_words) for c in copies}
                except Exception as e:      # this triton's Gluon has no host descriptors of this form
                    row["tma"] = f"{type(e).__name__}: {str(e)[:300]}"
                    descs = None
                for slots in args.slots if descs else []:
                    fns[f"tma{slots}"] = lambda c, s=slots: read_tma(descs[c.data_ptr()], out, n, row_words, s)
                    checked.add(f"tma{slots}")
        for name, fn in fns.items():
            try:
                if name in checked:
                    out.zero_()
                    fn(copies[0])
                    row[f"{name}_ok"] = bool(torch.equal(out[: n // 2], want))
                t = time_graph([lambda c=c, fn=fn: fn(c) for c in copies], min_ms=args.min_ms)
                row[name] = [round(t * 1e6, 2), round(nbytes / t / bw, 3)]
            except Exception as e:      # a Gluon variant this triton cannot build: the others still run
                if name not in checked:
                    raise
                row[name] = f"{type(e).__name__}: {str(e)[:300]}"
                torch.cuda.synchronize()
        print(json.dumps(row), flush=True)
        del copies
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
