"""How much of a decode step is its GEMVs, and how far those are from reading their bytes: the step's packed
matmuls replayed alone, in the model's order, as one CUDA graph.

    python benchmarks/probe_gemv_chain.py /root/q35.gguf

Prints one JSON object, all measured in this run:
- `decode_ms`: the engine's AR decode step (graph replay) at 512 tokens of context;
- `gemv_chain_ms`: every packed matmul of that step (each weight once as its own GEMV, also those that
  `kernels.gemv_two` runs in pairs; the model's order, int8 x made ahead), PDL as the engine launches it and off;
  `read_chain_ms`: a plain read of the same bytes per weight (one launch each, 16 KiB a program), the lower bound
  of a launch a weight; `copy_GBps` and `ideal_ms` (bytes read / copy bandwidth);
- `groups`: per (type, N, K) the same three numbers, so the shapes that lose most stand out;
- `sweep`: Q4_K GEMVs of K = 5120 and N from 1024 to 69632 (8448: one wave of 32 two-row programs an SM on 132
  SMs, 8960 a few programs more; 16896 two waves, 17408 as the 27B's FFN) and 5120 x 17408, alone, cycling over
  enough copies to defeat L2, PDL on / off, with the plain read of the same bytes: time = a + bytes / b shows the
  fixed cost of a call, and the wave pairs what a last partial wave costs.
(decode - gemv chain) is what the step's other kernels add; (gemv chain - read chain) what the GEMV kernels lose to
a read of their bytes; (read chain - ideal) what a launch a weight costs in itself.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from collections import defaultdict

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from gguf import GGMLQuantizationType as QT  # noqa: E402

from bench_gemv import L2_FLUSH_BYTES, copy_bandwidth, packed_copies, time_graph  # noqa: E402
from dflash24.kernels import pdl  # noqa: E402
from dflash24.kernels.pdl import launch_options, pdl_enter  # noqa: E402


@triton.jit
def _read_kernel(src_ptr, out_ptr, n_words, PER: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    """out[pid] = xor of the PER int32 words of this program's slice: every word read once, nothing else."""
    pdl_enter(PDL)
    base = tl.program_id(0).to(tl.int64) * PER
    acc = tl.zeros((BLOCK,), tl.int32)
    for i in tl.static_range(PER // BLOCK):
        offs = base + i * BLOCK + tl.arange(0, BLOCK)
        acc ^= tl.load(src_ptr + offs, mask=offs < n_words, other=0)
    tl.store(out_ptr + tl.program_id(0), tl.xor_sum(acc, 0))


def chain_ms(fns) -> float:
    """Median ms of a CUDA-graph replay of one run of fns in order (bench_gemv.time_graph with a graph of one run)."""
    return time_graph(fns, min_ms=0) * len(fns) * 1e3


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("gguf")
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--pos", type=int, default=512)
    ap.add_argument("--sweep-only", action="store_true", help="only the Q4_K sweep (no model: gguf is ignored)")
    ap.add_argument("--quick", action="store_true", help="the sweep at three shapes, the GEMV with PDL only")
    args = ap.parse_args()
    if args.sweep_only:
        bw = copy_bandwidth(1 << 30)
        print(json.dumps({"copy_GBps": round(bw / 1e9, 1), "sweep": sweep(bw, args.quick)}), flush=True)
        return 0
    from dflash24.config import EngineConfig
    from dflash24.engine import Engine
    from dflash24.quant import kernels as K
    from dflash24.quant.linear import QuantLinear

    eng = Engine(EngineConfig(model=args.gguf, ctx=args.ctx, device="cuda"))
    dev = torch.device("cuda")
    rep: dict = {"file": args.gguf, "device": torch.cuda.get_device_name(0)}
    ids = torch.randint(0, 200_000, (args.pos,), device=dev)
    tok = eng.runner.prefill(ids, 0, 512).argmax(-1).view(1)
    eng.runner.decode(tok, args.pos)
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(20):
        eng.runner.decode(tok, args.pos)
    b.record()
    b.synchronize()
    rep["decode_ms"] = round(a.elapsed_time(b) / 20, 4)

    lins = [m for m in eng.model.modules() if isinstance(m, QuantLinear) and m.packed is not None]
    rows = {}
    for k in sorted({m.in_features for m in lins}):
        x = torch.randn(k, device=dev, dtype=torch.bfloat16)
        w4, dx, xs = K.quantize_x(x, QT.Q4_K)
        w6 = K.quantize_x(x, QT.Q6_K)[0]
        rows[k] = (x, K.Int8Rows(w4, w6, dx, xs))
    bufs = [torch.randint(0, 1 << 30, (m.packed.nbytes // 4,), device=dev, dtype=torch.int32) for m in lins]
    outs = [torch.empty(triton.cdiv(buf.numel(), 4096), device=dev, dtype=torch.int32) for buf in bufs]

    def gemv_fn(m):
        x, r = rows[m.in_features]
        return lambda: K.gemv(x, m.packed, bias=m.bias, int8=r)

    def read_fn(i):
        buf, out = bufs[i], outs[i]
        return lambda: _read_kernel[(out.numel(),)](buf, out, buf.numel(), PER=4096, BLOCK=1024, num_warps=4,
                                                    **launch_options(dev))

    total = sum(m.packed.nbytes for m in lins)
    bw = copy_bandwidth(1 << 30)
    rep.update(n_matmuls=len(lins), weight_bytes=total, copy_GBps=round(bw / 1e9, 1),
               ideal_ms=round(total / bw * 1e3, 4))
    pdl_on = pdl.ENABLED
    rep["gemv_chain_ms"] = round(chain_ms([gemv_fn(m) for m in lins]), 4)
    rep["read_chain_ms"] = round(chain_ms([read_fn(i) for i in range(len(lins))]), 4)
    pdl.ENABLED = False
    rep["gemv_chain_ms_pdl_off"] = round(chain_ms([gemv_fn(m) for m in lins]), 4)
    rep["read_chain_ms_pdl_off"] = round(chain_ms([read_fn(i) for i in range(len(lins))]), 4)
    pdl.ENABLED = pdl_on
    groups = defaultdict(list)
    for i, m in enumerate(lins):
        groups[(m.qtype.name, m.out_features, m.in_features)].append(i)
    rep["groups"] = []
    for (qt, n, k), idx in sorted(groups.items(), key=lambda kv: -sum(lins[i].packed.nbytes for i in kv[1])):
        nbytes = sum(lins[i].packed.nbytes for i in idx)
        g = chain_ms([gemv_fn(lins[i]) for i in idx])
        r = chain_ms([read_fn(i) for i in idx])
        ideal = nbytes / bw * 1e3
        rep["groups"].append({"type": qt, "n": n, "k": k, "calls": len(idx), "cfg": K.gemv_config(lins[idx[0]].packed,
                              dev), "gemv_us_each": round(g * 1e3 / len(idx), 2),
                              "read_us_each": round(r * 1e3 / len(idx), 2),
                              "ideal_us_each": round(ideal * 1e3 / len(idx), 2)})
    print(json.dumps(rep), flush=True)
    del bufs, outs
    torch.cuda.empty_cache()
    rep["sweep"] = sweep(bw)
    print(json.dumps(rep), flush=True)
    return 0


def sweep(bw: float, quick: bool = False) -> list:
    """Q4_K GEMVs alone by shape (module docstring), us a call, PDL on / off, and the read of the same bytes
    (quick: three shapes, the GEMV with PDL)."""
    from dflash24.quant import kernels as K
    dev = torch.device("cuda")
    res = []
    shapes = ((1024, 5120), (4096, 5120), (8448, 5120), (8960, 5120), (12288, 5120), (16896, 5120), (17408, 5120),
              (34816, 5120), (69632, 5120), (5120, 17408))
    for n, k in ((8960, 5120), (17408, 5120), (34816, 5120)) if quick else shapes:
        ws = packed_copies(QT.Q4_K, n, k)
        x = torch.randn(k, device=dev, dtype=torch.bfloat16)
        w4, dx, xs = K.quantize_x(x, QT.Q4_K)
        r = K.Int8Rows(w4, K.quantize_x(x, QT.Q6_K)[0], dx, xs)
        nbytes = ws[0].nbytes
        bufs = [torch.randint(0, 1 << 30, (nbytes // 4,), device=dev, dtype=torch.int32)
                for _ in range(0 if quick else max(2, -(-L2_FLUSH_BYTES // nbytes)))]
        outs = [torch.empty(triton.cdiv(b.numel(), 4096), device=dev, dtype=torch.int32) for b in bufs]
        row = {"n": n, "k": k, "bytes": nbytes, "ideal_us": round(nbytes / bw * 1e6, 2),
               "cfg": K.gemv_config(ws[0], dev)}
        for on in (True,) if quick else (True, False):
            pdl.ENABLED = on
            tag = "pdl" if on else "nopdl"
            row[f"gemv_us_{tag}"] = round(1e6 * time_graph([lambda w=w: K.gemv(x, w, int8=r) for w in ws],
                                                           min_ms=5), 2)
            if quick:
                continue
            row[f"read_us_{tag}"] = round(1e6 * time_graph(
                [lambda b=b, o=o: _read_kernel[(o.numel(),)](b, o, b.numel(), PER=4096, BLOCK=1024, num_warps=4,
                                                             **launch_options(dev)) for b, o in zip(bufs, outs)],
                min_ms=5), 2)
        pdl.ENABLED = True
        res.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
        del ws, bufs, outs
        torch.cuda.empty_cache()
    return res


if __name__ == "__main__":
    sys.exit(main())
