"""qwen35 target on CUDA: copy bandwidth, AR decode tok/s (CUDA graph), roofline fraction, prefill tok/s,
DeltaNet kernel timings, peak memory. Prints one JSON object (every section reports its own error).

    python -m dflash24.synth --preset qwen35-27b --out /root/q35-27b.gguf
    python benchmarks/bench_qwen35.py /root/q35-27b.gguf --gpu-mem 24

Roofline: decode must read every weight once per token except `token_embd` (gathered, not multiplied), so
roofline tok/s = measured device copy bandwidth (read + write bytes / s) / weight bytes per token.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import traceback

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402

GiB = 1 << 30


def _sync_time(fn, iters: int, warmup: int = 2) -> float:
    """Mean seconds per call of fn (CUDA events around `iters` calls)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1e3 / iters


def copy_bandwidth(nbytes: int = 1 * GiB) -> dict:
    a = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    a.fill_(1)
    t = _sync_time(lambda: b.copy_(a), iters=20)
    f = a.view(torch.float32)
    t_sum = _sync_time(lambda: f.sum(), iters=20)
    del a, b, f
    torch.cuda.empty_cache()
    return {"copy_GBps": round(2 * nbytes / t / 1e9, 1), "read_sum_GBps": round(nbytes / t_sum / 1e9, 1)}


# Dense BF16 tensor-core peak from the vendor's data sheet (no sparsity), by device name.
BF16_PEAK_TFLOPS = {"H200": 989.4, "H100 80GB HBM3": 989.4, "RTX 3090": 71.0, "RTX 4090": 165.2}


def bf16_peak(name: str) -> float | None:
    return next((v for k, v in BF16_PEAK_TFLOPS.items() if k in name), None)


def cublas_tflops(n: int = 8192) -> float:
    """What cuBLAS reaches on one large bf16 matmul on this device (the practical ceiling)."""
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    t = _sync_time(lambda: a @ b, iters=10)
    return 2 * n ** 3 / t / 1e12


def prefill_flops(cfg, weight_elems: int, n: int) -> float:
    """FLOPs of an n-token prompt: 2 per matmul weight per token (every layer; the LM head only for the last
    token) + causal attention's QK^T and PV in the full-attention layers (4 x heads x head_dim per token pair).
    The DeltaNet chunk recurrences are left out (a few % at these sizes)."""
    n_attn = sum(1 for i in range(cfg.n_layers) if cfg.is_attention(i))
    return 2.0 * weight_elems * n + 4.0 * n_attn * cfg.n_heads * cfg.head_dim * n * (n + 1) / 2


def deltanet_kernels(cfg) -> dict:
    from dflash24.kernels import deltanet as dn
    hk, dk, hv, dv = cfg.ssm_k_heads, cfg.ssm_k_dim, cfg.ssm_v_heads, cfg.ssm_v_dim
    out = {"fla_available": dn._fla_chunk is not None, "triton_available": dn.triton is not None}
    state = torch.zeros(hv, dk, dv, device="cuda")
    for T in (1, 16, 64, 512, 4096):
        q = dn.l2norm(torch.randn(T, hk, dk, device="cuda")) * dk ** -0.5
        k = dn.l2norm(torch.randn(T, hk, dk, device="cuda"))
        v = torch.randn(T, hv, dv, device="cuda")
        g = -torch.rand(T, hv, device="cuda")
        beta = torch.rand(T, hv, device="cuda")
        iters = 50 if T <= 64 else 5
        out[f"gated_delta_rule_T{T}_ms"] = round(1e3 * _sync_time(lambda: dn.gated_delta_rule(q, k, v, g, beta, state), iters), 4)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("gguf")
    ap.add_argument("--gpu-mem", type=float, default=None, help="emulate a card of this many GiB")
    ap.add_argument("--ctx", type=int, default=16384)
    ap.add_argument("--decode-tokens", type=int, default=128)
    ap.add_argument("--prefill", default="512,4096,13000", help="prompt lengths to time")
    ap.add_argument("--prefill-chunk", type=int, default=None)
    ap.add_argument("--prefill-chunks", default="", help="also time --prefill at each of these chunk sizes "
                    "(e.g. 512,2048,4096), with the peak memory each adds, in the same run")
    ap.add_argument("--no-graphs", action="store_true")
    args = ap.parse_args()
    report: dict = {"file": args.gguf, "errors": {}}

    def section(name, fn):
        try:
            report[name] = fn()
        except Exception as e:  # noqa: BLE001 - keep measuring the other sections
            report["errors"][name] = f"{type(e).__name__}: {e}"
            traceback.print_exc(file=sys.stderr)
            if isinstance(e, torch.cuda.OutOfMemoryError):
                torch.cuda.empty_cache()

    if not torch.cuda.is_available():
        report["errors"]["device"] = "CUDA is not available"
        print(json.dumps(report))
        return 1
    props = torch.cuda.get_device_properties(0)
    free0, total = torch.cuda.mem_get_info()
    report["device"] = {"name": props.name, "total_GiB": round(total / GiB, 2), "torch": torch.__version__}
    try:
        import triton
        report["device"]["triton"] = triton.__version__
    except ImportError:
        pass
    if args.gpu_mem:
        frac = min(1.0, args.gpu_mem * GiB / total)
        torch.cuda.set_per_process_memory_fraction(frac)
        report["device"]["memory_fraction"] = round(frac, 4)

    section("bandwidth", copy_bandwidth)

    from dflash24.config import EngineConfig
    from dflash24.engine import Engine
    from dflash24.gguf.reader import GGUFFile
    from dflash24.models.qwen35 import Qwen35Config

    t0 = time.perf_counter()
    engine = None
    try:
        kw = {"prefill_chunk": args.prefill_chunk} if args.prefill_chunk else {}
        engine = Engine(EngineConfig(model=args.gguf, ctx=args.ctx, device="cuda", cuda_graphs=not args.no_graphs, **kw))
    except Exception as e:  # noqa: BLE001
        report["errors"]["load"] = f"{type(e).__name__}: {e}"
        traceback.print_exc(file=sys.stderr)
    report["load_s"] = round(time.perf_counter() - t0, 2)
    if engine is not None:
        report["prefill_chunk"] = engine.config.prefill_chunk          # --prefill-chunk, or the plan's choice
    tensors = GGUFFile(args.gguf).tensors
    gf_bytes = {n: t.n_bytes for n, t in tensors.items()}
    weight_bytes = sum(b for n, b in gf_bytes.items() if n != "token_embd.weight")
    report["weights"] = {"file_tensor_bytes": sum(gf_bytes.values()), "bytes_per_token": weight_bytes}
    if engine is None:
        print(json.dumps(report))
        return 1
    report["memory_after_load"] = {"allocated_GiB": round(torch.cuda.memory_allocated() / GiB, 3),
                                   "cache_GiB": round(engine.cache.nbytes / GiB, 3)}
    runner, model, dev = engine.runner, engine.model, engine.device
    if hasattr(model, "cfg") and isinstance(model.cfg, Qwen35Config):
        section("deltanet", lambda: deltanet_kernels(model.cfg))
    vocab = model.cfg.vocab_size

    def decode(prompt_len: int, n: int) -> dict:
        ids = torch.randint(0, min(vocab, 200_000), (prompt_len,), device=dev)
        logits = runner.prefill(ids, 0, engine.config.prefill_chunk)
        tok = logits.argmax(-1).view(1)
        pos = prompt_len
        for _ in range(3):                                 # graph capture + warm-up (same KV bucket)
            logits, _ = runner.decode(tok, pos)
            tok = logits.argmax(-1).view(1)
            pos += 1
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(n):
            logits, _ = runner.decode(tok, pos)
            tok = logits.argmax(-1).view(1)                # stays on the device: no host sync per token
            pos += 1
        torch.cuda.synchronize()
        dt = (time.perf_counter() - t) / n
        return {"ms_per_token": round(1e3 * dt, 3), "tokens_per_s": round(1 / dt, 2),
                "finite": bool(torch.isfinite(logits).all())}

    section("decode", lambda: decode(64, args.decode_tokens))
    if "decode" in report and "bandwidth" in report:
        roof = report["bandwidth"]["copy_GBps"] * 1e9 / weight_bytes
        report["decode"]["roofline_tokens_per_s"] = round(roof, 1)
        report["decode"]["roofline_fraction"] = round(report["decode"]["tokens_per_s"] / roof, 3)
        report["decode"]["achieved_weight_GBps"] = round(weight_bytes * report["decode"]["tokens_per_s"] / 1e9, 1)

    def prefill_times(chunk: int) -> dict:
        out = {}
        for n in [int(x) for x in args.prefill.split(",") if x]:
            if n + 8 > args.ctx:
                out[str(n)] = f"skipped: longer than --ctx {args.ctx}"
                continue
            try:
                ids = torch.randint(0, min(vocab, 200_000), (n,), device=dev)
                runner.prefill(ids[:min(n, chunk)], 0, chunk)                # warm-up (this chunk's shapes)
                torch.cuda.synchronize()
                base = torch.cuda.memory_allocated()
                torch.cuda.reset_peak_memory_stats()
                t = time.perf_counter()
                logits = runner.prefill(ids, 0, chunk)
                torch.cuda.synchronize()
                dt = time.perf_counter() - t
                tflops = prefill_flops(model.cfg, layer_weight_elems, n) / dt / 1e12
                out[str(n)] = {"s": round(dt, 3), "tokens_per_s": round(n / dt, 1), "tflops": round(tflops, 1),
                               "bf16_peak_fraction": round(tflops / peak, 3) if peak else None,
                               "cublas_fraction": round(tflops / cublas, 3),
                               "finite": bool(torch.isfinite(logits).all()),
                               "peak_added_GiB": round((torch.cuda.max_memory_allocated() - base) / GiB, 3)}
            except torch.cuda.OutOfMemoryError as e:
                out[str(n)] = f"OOM: {str(e).splitlines()[0]}"
                torch.cuda.empty_cache()
            except Exception as e:  # noqa: BLE001
                out[str(n)] = f"{type(e).__name__}: {e}"
                traceback.print_exc(file=sys.stderr)
        return out

    layer_weight_elems = sum(math.prod(t.shape) for name, t in tensors.items()
                             if name.startswith("blk.") and name.endswith(".weight") and len(t.shape) == 2
                             and "conv1d" not in name)
    peak = bf16_peak(torch.cuda.get_device_name())
    cublas = cublas_tflops()
    report["bf16"] = {"peak_tflops": peak, "cublas_8192_tflops": round(cublas, 1),
                      "layer_matmul_weights": layer_weight_elems}
    report["prefill"] = prefill_times(engine.config.prefill_chunk)
    if args.prefill_chunks:
        report["prefill_by_chunk"] = {c: prefill_times(int(c)) for c in args.prefill_chunks.split(",") if c}
    section("decode_after_long_prefill", lambda: decode(min(4096, args.ctx - 64), 32))

    free1, _ = torch.cuda.mem_get_info()
    used = total - free1
    report["memory"] = {"max_allocated_GiB": round(torch.cuda.max_memory_allocated() / GiB, 3),
                        "reserved_GiB": round(torch.cuda.memory_reserved() / GiB, 3),
                        "device_used_GiB": round(used / GiB, 3),
                        "non_torch_GiB": round((used - torch.cuda.memory_reserved()) / GiB, 3),
                        "device_used_at_start_GiB": round((total - free0) / GiB, 3),
                        "peak_estimate_GiB": round((torch.cuda.max_memory_allocated() + used - torch.cuda.memory_reserved()) / GiB, 3)}
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
