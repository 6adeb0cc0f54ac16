"""Prefill attention at long context: one prompt chunk of T queries attending causally over a cache of S rows
(the chunk is the cache's last T rows), per KV type, on a CUDA GPU.

    python benchmarks/bench_prefill_attention.py [--chunk 4096] [--contexts 8192,32768,131072]
                                                 [--kv bf16,q8_0,q4_0,tq3] [--configs JSON] [--no-sdpa]
                                                 [--segments 0,8192,32768]
                                                 [--module dflash24.kernels.attention] [--device cuda]

The qwen35 attention shape by default (24 query heads, 4 KV heads, head dim 256). For each (context, KV type):
`kernels.attention.attention` as the engine calls it (its own tile choice), then each tile config of --configs
(a JSON list of {"BLOCK_M", "BLOCK_N", "num_warps", "num_stages"}; its output's max |difference| from the default
is printed beside the time), for a quantized type each --segments value (`attention(..., segment_rows=N)`: rows
decoded into a dense scratch N at a time; 0: the quantized tiles read the cache; with its max |difference|), and
for bf16 torch's SDPA with a lower-right causal mask (flash / efficient backend, the K/V heads expanded first; not
timed in the KV types' memory) as the reference speed. Time: the mean of 3 calls
after a warm-up (CUDA events; the figures of 2026-12-06 in BENCHMARKS.md were medians of 3). TFLOP/s counts the
causal FLOPs only: 4 * heads * head_dim per visible (query, key) pair.
One JSON line per case. --module times another copy of kernels/attention.py (e.g. another commit's, saved as
dflash24/kernels/attention_prev.py) for an A/B in one process. `--device cpu` (with TRITON_INTERPRET=1, tiny
shapes: --heads 4 --kv-heads 2 --head-dim 128 --chunk 8 --contexts 40) only checks that the script runs.
"""
from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_spec import timed  # noqa: E402

from dflash24.cache import kvquant  # noqa: E402


def time_call(fn, cuda: bool, repeats: int = 3) -> float:
    """Seconds a call of fn() after one warm-up call: on CUDA the mean of `repeats` (`bench_spec.timed`), on a CPU
    the host clock's median."""
    if cuda:
        return timed(fn, repeats, warmup=1) / 1e3
    fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return sorted(times)[repeats // 2]


def causal_flops(T: int, S: int, H: int, D: int) -> float:
    """QK^T and PV FLOPs of T queries at rows S - T .. S - 1, each seeing the rows up to its own."""
    visible = T * (S - T) + T * (T + 1) / 2
    return 4.0 * H * D * visible


def make_cache(kv: str, S: int, Hk: int, D: int, gen, device: str):
    dense = torch.randn(S, Hk, D, generator=gen).to(device, torch.bfloat16)
    if kv in kvquant.DENSE_TYPES:
        return dense.to(kvquant.DENSE_TYPES[kv])
    return kvquant.PackedKV(kvquant.encode(dense, kv), kv, D)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--chunk", type=int, default=4096)
    ap.add_argument("--contexts", default="8192,32768,131072")
    ap.add_argument("--kv", default="bf16,q8_0,q4_0,tq3")
    ap.add_argument("--configs", default="[]", help="JSON list of tile configs to time beside the default")
    ap.add_argument("--heads", type=int, default=24)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--head-dim", type=int, default=256)
    ap.add_argument("--segments", default="", help="segment_rows values to time beside the default (quantized types)")
    ap.add_argument("--no-sdpa", action="store_true")
    ap.add_argument("--module", default="dflash24.kernels.attention", help="the attention module to time")
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    A = importlib.import_module(args.module)
    dev = args.device
    if dev == "cuda" and not torch.cuda.is_available():
        raise SystemExit("bench_prefill_attention.py needs a CUDA GPU (or --device cpu under TRITON_INTERPRET=1)")
    H, Hk, D, T = args.heads, args.kv_heads, args.head_dim, args.chunk
    configs = json.loads(args.configs)
    name = torch.cuda.get_device_name() if dev == "cuda" else dev
    print(json.dumps({"device": name, "module": args.module, "heads": H, "kv_heads": Hk,
                      "head_dim": D, "chunk": T}), flush=True)
    gen = torch.Generator().manual_seed(0)
    for S in (int(s) for s in args.contexts.split(",")):
        q = torch.randn(T, H, D, generator=gen).to(dev, torch.bfloat16)
        slots = torch.arange(S - T, S, device=dev)
        flops = causal_flops(T, S, H, D)
        scale = D ** -0.5
        for kv in args.kv.split(","):
            k_cache, v_cache = make_cache(kv, S, Hk, D, gen, dev), make_cache(kv, S, Hk, D, gen, dev)
            run = lambda cfg=None: A.attention(q, k_cache, v_cache, scale, S, slots=slots, config=cfg)  # noqa: E731
            ref = run()
            sec = time_call(run, dev == "cuda")
            row = {"context": S, "kv": kv, "ms": round(sec * 1e3, 2), "tflops": round(flops / sec / 1e12, 1)}
            for cfg in configs:
                try:
                    out = run(cfg)
                    c_sec = time_call(lambda: run(cfg), dev == "cuda")
                    err = float((out.float() - ref.float()).abs().max())
                    row.setdefault("configs", []).append(dict(cfg, ms=round(c_sec * 1e3, 2),
                                                              tflops=round(flops / c_sec / 1e12, 1),
                                                              max_diff=round(err, 5)))
                except Exception as e:      # a config past the device's shared memory, a compile error
                    row.setdefault("configs", []).append(dict(cfg, error=f"{type(e).__name__}: {str(e)[:120]}"))
            for seg in (int(n) for n in args.segments.split(",") if n and kv not in kvquant.DENSE_TYPES):
                call = lambda: A.attention(q, k_cache, v_cache, scale, S, slots=slots, segment_rows=seg)  # noqa: E731
                out = call()
                s_sec = time_call(call, dev == "cuda")
                diff = float((out.float() - ref.float()).abs().max())
                row.setdefault("segments", []).append(dict(segment_rows=seg, ms=round(s_sec * 1e3, 2),
                                                           tflops=round(flops / s_sec / 1e12, 1),
                                                           max_diff=round(diff, 5)))
            if kv == "bf16" and not args.no_sdpa:
                from torch.nn.attention.bias import causal_lower_right
                G = H // Hk
                kx = k_cache.transpose(0, 1).repeat_interleave(G, 0).unsqueeze(0)       # [1, H, S, D]
                vx = v_cache.transpose(0, 1).repeat_interleave(G, 0).unsqueeze(0)
                qx = q.transpose(0, 1).unsqueeze(0)
                mask = causal_lower_right(T, S)
                sdpa = lambda: F.scaled_dot_product_attention(qx, kx, vx, attn_mask=mask, scale=scale)  # noqa: E731
                s_out = sdpa()
                s_sec = time_call(sdpa, dev == "cuda")
                row["sdpa_lower_right"] = {"ms": round(s_sec * 1e3, 2), "tflops": round(flops / s_sec / 1e12, 1),
                                           "max_diff": round(float((s_out[0].transpose(0, 1).float()
                                                                    - ref.float()).abs().max()), 5)}
                del kx, vx, s_out
            print(json.dumps(row), flush=True)
            k_cache = v_cache = ref = None      # freed before the next type's caches
            if dev == "cuda":
                torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
