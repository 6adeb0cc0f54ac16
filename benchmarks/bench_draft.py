"""Time one DFlash draft step of a random BF16 drafter of the Qwen3.6-27B drafter's shape, on CUDA.

Shape (z-lab/Qwen3.6-27B-DFlash as published configs report it; FACTS.md section 3): 5 layers,
hidden 5120, FFN 17408, 32 heads / 8 KV heads x 128, block 16, layers 0-3 sliding (window 2048,
causal inside the block, z-lab's default) + layer 4 full, RoPE theta 1e7, vocab 248320 (target
embedding + lm_head, random BF16, dense). Context rows: --ctx (default 512 and 4096).

Prints one JSON object per drafter format: per context, eager and CUDA-graph ms per draft step,
add_context of 16 rows, bytes read per step (drafter weights + lm_head) and the GB/s that implies, and
the graph-vs-eager max |logit| difference (the graph must reproduce eager). Formats: bf16 (the weights
as z-lab ships them), and q8_0 / q6_k / q4_k: the same random weights written as a GGUF drafter in Luce
DFlash's layout (`save_gguf`, the K-quant search run on the GPU) and loaded back, so the matrices run on
the block kernels; the row of each format also gives the top-1 agreement and cosine of its draft logits
with bf16's at the first context.
`--preset qwen25-0.5b`: the shape trained for the embedded 0.5B (3 layers, 896 wide, FFN 2432, 14 / 2
heads x 64, vocab 151936, all layers full attention), whose 896-wide matrices are not multiples of 256:
its K-quant drafters fall back to Q8_0 (see save_gguf).

    python benchmarks/bench_draft.py [--ctx 512,4096] [--iters 50] [--layers 5] [--formats bf16,q8_0,q6_k,q4_k]
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

import torch
import torch.nn.functional as F

from dflash24.models.drafter import FULL, SLIDING, DFlashConfig, DFlashDrafter, random_state_dict, save_gguf

FORMATS = {"bf16": None, "q8_0": "Q8_0", "q6_k": "Q6_K", "q4_k": "Q4_K"}


def qwen36_27b_draft_config(n_layers: int, max_positions: int) -> DFlashConfig:
    types = (SLIDING,) * (n_layers - 1) + (FULL,)
    return DFlashConfig(
        n_layers=n_layers, dim=5120, ffn_dim=17408, n_heads=32, n_kv_heads=8, head_dim=128, norm_eps=1e-6,
        rope_theta=1e7, max_positions=max_positions, vocab_size=248320,
        target_layer_ids=(1, 16, 31, 46, 61)[:n_layers] if n_layers <= 5 else tuple(range(1, n_layers + 1)),
        block_size=16, mask_token_id=248070, layer_types=types, sliding_window=2048,
        causal=tuple(t == SLIDING for t in types), n_target_layers=64)


def qwen25_05b_draft_config(n_layers: int, max_positions: int) -> DFlashConfig:
    return DFlashConfig(
        n_layers=n_layers, dim=896, ffn_dim=2432, n_heads=14, n_kv_heads=2, head_dim=64, norm_eps=1e-6,
        rope_theta=1e6, max_positions=max_positions, vocab_size=151936,
        target_layer_ids=(1, 12, 22)[:n_layers] if n_layers <= 3 else tuple(range(1, n_layers + 1)),
        block_size=16, mask_token_id=151935, layer_types=(FULL,) * n_layers, sliding_window=None,
        causal=(False,) * n_layers, n_target_layers=24)


PRESETS = {"qwen36-27b": (qwen36_27b_draft_config, 5), "qwen25-0.5b": (qwen25_05b_draft_config, 3)}


def build(cfg: DFlashConfig, fmt: str, dev, dtype, tmpdir: str) -> DFlashDrafter:
    """The random drafter of `cfg` (seed 0) in format `fmt`: bf16 from the state dict, else through a GGUF file."""
    sd = random_state_dict(cfg, 0, dtype, dev)
    if FORMATS[fmt] is None:
        return DFlashDrafter.from_state_dict(cfg, sd, dev, dtype)
    path = os.path.join(tmpdir, f"draft-{fmt}.gguf")
    save_gguf(cfg, sd, path, FORMATS[fmt], quant_device=dev)
    del sd
    try:
        return DFlashDrafter.from_gguf(path, dev, dtype, n_target_layers=cfg.n_target_layers)
    finally:
        os.unlink(path)


def module_bytes(drafter: torch.nn.Module) -> int:
    """Bytes of the drafter's matrices as stored (packed blocks for quantized ones)."""
    total = 0
    for m in drafter.modules():
        if not hasattr(m, "out_features"):
            continue
        n = getattr(m, "nbytes", None)
        total += n if isinstance(n, int) else m.weight.numel() * m.weight.element_size()
    return total


def median_ms(fn, iters: int, device: torch.device) -> float:
    """Median of `iters` timings of fn() in ms (CUDA events on CUDA, wall clock elsewhere)."""
    times = []
    for _ in range(iters):
        if device.type == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b))
        else:
            t = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t) * 1e3)
    return sorted(times)[len(times) // 2]


def capture(fn) -> torch.cuda.CUDAGraph:
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g


@torch.inference_mode()
def run(cfg: DFlashConfig, contexts: list[int], iters: int, device, dtype=torch.bfloat16, fmt: str = "bf16",
        tmpdir: str | None = None) -> dict:
    """Build a random drafter (format `fmt`) + target embedding/lm_head of `cfg`'s shape and time draft
    steps. CUDA graphs only on CUDA (elsewhere the graph fields are None)."""
    dev = torch.device(device)
    cuda = dev.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(dir=tmpdir) as td:
        drafter = build(cfg, fmt, dev, dtype, td)
    g = torch.Generator(device=dev).manual_seed(1)
    emb = torch.randn(cfg.vocab_size, cfg.dim, generator=g, device=dev, dtype=dtype)
    head = torch.randn(cfg.vocab_size, cfg.dim, generator=g, device=dev, dtype=dtype) * cfg.dim ** -0.5
    embed, lm_head = (lambda ids: emb[ids]), (lambda h: F.linear(h, head))
    setup_s = time.perf_counter() - t0
    weight_bytes = module_bytes(drafter)
    step_bytes = weight_bytes + head.numel() * head.element_size()
    n_feat, B = len(cfg.target_layer_ids) * cfg.dim, cfg.block_size

    results = []
    for ctx in contexts:
        cache = drafter.new_cache(ctx + B, dtype, dev)
        feats = torch.randn(ctx, n_feat, device=dev, dtype=dtype, generator=g)
        for lo in range(0, ctx, 1024):                                  # fill the context in chunks
            hi = min(ctx, lo + 1024)
            drafter.add_context(feats[lo:hi], torch.arange(lo, hi, device=dev), cache)
        last, start = torch.tensor([42], device=dev), torch.tensor([ctx], device=dev)
        out = {}

        def step():
            out["logits"] = drafter.draft(last, start, cache, embed, lm_head, kv_rows=ctx + B)

        f16, p16 = feats[-B:].clone(), torch.arange(ctx - B, ctx, device=dev)

        def ctx_step():
            drafter.add_context(f16, p16, cache)

        r = {"ctx": ctx, "kv_rows": ctx + B, "draft_cache_MiB": round(cache.nbytes / 2**20, 1),
             "draft_eager_ms": round(median_ms(step, iters, dev), 3)}
        eager_logits = out["logits"].clone()
        if ctx == contexts[0]:
            first_logits = eager_logits.float().cpu()
        r["add_context16_eager_ms"] = round(median_ms(ctx_step, iters, dev), 3)
        r.update(draft_graph_ms=None, draft_graph_GBps=None, add_context16_graph_ms=None,
                 graph_vs_eager_max_abs_logit_diff=None, logits_shape=list(eager_logits.shape))
        if cuda:
            graph = capture(step)
            r["draft_graph_ms"] = round(median_ms(graph.replay, iters, dev), 3)
            r["draft_graph_GBps"] = round(step_bytes / r["draft_graph_ms"] / 1e6, 1)
            graph.replay()
            r["graph_vs_eager_max_abs_logit_diff"] = (out["logits"].float() - eager_logits.float()).abs().max().item()
            ctx_graph = capture(ctx_step)
            r["add_context16_graph_ms"] = round(median_ms(ctx_graph.replay, iters, dev), 3)
            del graph, ctx_graph
        results.append(r)
        del cache

    return {
        "device": torch.cuda.get_device_name() if cuda else str(dev), "torch": torch.__version__,
        "dtype": str(dtype).removeprefix("torch."), "format": fmt,
        "drafter": {"layers": cfg.n_layers, "dim": cfg.dim, "ffn": cfg.ffn_dim, "heads": cfg.n_heads,
                    "kv_heads": cfg.n_kv_heads, "head_dim": cfg.head_dim, "block": B, "vocab": cfg.vocab_size,
                    "layer_types": list(cfg.layer_types), "window": cfg.sliding_window},
        "drafter_weight_bytes": weight_bytes, "bytes_per_draft_step": step_bytes, "setup_s": round(setup_s, 1),
        "peak_mem_GiB": round(torch.cuda.max_memory_allocated() / 2**30, 2) if cuda else None,
        "results": results, "first_logits": first_logits}


def agreement(a: torch.Tensor, b: torch.Tensor) -> dict:
    """Top-1 agreement and mean cosine of two (rows, vocab) logit tensors."""
    return {"top1_agreement": round(float((a.argmax(-1) == b.argmax(-1)).float().mean()), 4),
            "cosine": round(float(F.cosine_similarity(a, b, dim=-1).mean()), 6)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ctx", default="512,4096")
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--preset", default="qwen36-27b", choices=sorted(PRESETS))
    ap.add_argument("--layers", type=int, default=None, help="default: the preset's (27B: 5, 0.5B: 3)")
    ap.add_argument("--formats", default="bf16", help="comma-separated of " + ",".join(FORMATS))
    ap.add_argument("--tmpdir", default=None, help="where the GGUF drafters are written (default: the system's)")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_draft.py needs CUDA")
    fmts = args.formats.split(",")
    bad = [f for f in fmts if f not in FORMATS]
    if bad:
        raise SystemExit(f"--formats: unknown {bad}; choose from {','.join(FORMATS)}")
    contexts = [int(x) for x in args.ctx.split(",")]
    make, layers = PRESETS[args.preset]
    cfg = make(args.layers or layers, max(contexts) + 64)
    ref = None
    for fmt in fmts:
        res = run(cfg, contexts, args.iters, "cuda", fmt=fmt, tmpdir=args.tmpdir)
        logits = res.pop("first_logits")
        if fmt == "bf16":
            ref = logits
        elif ref is not None:
            res["vs_bf16"] = agreement(logits, ref)
        res["preset"] = args.preset
        print(json.dumps(res), flush=True)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
