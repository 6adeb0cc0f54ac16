"""Next-token quality of quantized KV caches on a real model: top-1 agreement and KL vs an f32 KV cache.

Teacher-forced over real text (default: the source of Python's own `argparse` module, read from the
installed stdlib: not a benchmark set). The same token sequence is prefilled in chunks through one cache per
KV type, in lockstep; every chunk's next-token distributions are compared with the f32 cache's at the same
positions and discarded (the full [N, vocab] logits of four runs would not fit in RAM). Each chunk attends
to all earlier rows as stored (quantized rows are encoded at write, as in the engine), so the error of a
position includes the quantization of its whole context.

Metrics per type (positions 0..N-1): top1 = fraction where argmax equals the f32 argmax; kl_mean / kl_p99 /
kl_max = KL(p_f32 || p_type) in nats; also the cache bytes per token.

  python benchmarks/kv_quality.py [--model X.gguf] [--tokens 2048] [--chunk 256] [--types q8_0,q4_0,tq3]
Prints one JSON object.
"""
from __future__ import annotations

import argparse
import inspect
import json
import os
import platform
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from dflash24.gguf.reader import GGUFFile  # noqa: E402
from dflash24.gguf.tokenizer import Tokenizer  # noqa: E402
from dflash24.models import load_target  # noqa: E402
from dflash24.models.layers import Step  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None, help="GGUF (default: Qwen2.5-Coder-1.5B from dflash24.default_model)")
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--chunk", type=int, default=256)
    ap.add_argument("--types", default="q8_0,q4_0,tq3", help="comma list; 'k:v' for a mixed pair, e.g. q8_0:tq3")
    ap.add_argument("--text-module", default="argparse", help="stdlib module whose source is the text")
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    path = args.model
    if path is None:
        from dflash24.default_model import qwen25_15b_path
        path = qwen25_15b_path()
        if path is None:
            raise SystemExit("Qwen2.5-Coder-1.5B is not installed; pass --model X.gguf")
    t0 = time.perf_counter()
    gf = GGUFFile(path)
    tok = Tokenizer.from_gguf(gf)
    src = inspect.getsource(__import__(args.text_module))
    ids = tok.encode(src)
    if len(ids) < args.tokens:
        raise SystemExit(f"{args.text_module} gives only {len(ids)} tokens (< --tokens {args.tokens})")
    ids = torch.tensor(ids[:args.tokens])
    N = ids.shape[0]
    model = load_target(gf, "cpu", torch.float32, N)
    cfg = model.cfg
    pairs = [tuple(t.split(":")) if ":" in t else (t, t) for t in args.types.split(",")]
    caches = {"f32": model.new_cache(N, (torch.float32, torch.float32), "cpu")}
    for k, v in pairs:
        caches[f"{k}:{v}" if k != v else k] = model.new_cache(N, (k, v), "cpu")
    stats = {name: {"top1": 0, "kl": []} for name in caches if name != "f32"}
    load_s = time.perf_counter() - t0
    t1 = time.perf_counter()
    with torch.inference_mode():
        for start in range(0, N, args.chunk):
            n = min(args.chunk, N - start)
            step = Step.sequential(start, n)
            out = {}
            for name, cache in caches.items():
                h, _ = model.forward(ids[start:start + n], step, cache)
                out[name] = torch.log_softmax(model.logits(h), dim=-1)
            ref = out.pop("f32")
            pref, top = ref.exp(), ref.argmax(-1)
            for name, lp in out.items():
                stats[name]["top1"] += int((lp.argmax(-1) == top).sum())
                stats[name]["kl"].append((pref * (ref - lp)).sum(-1))
            running = {k: (round(v["top1"] / (start + n), 4), round(torch.cat(v["kl"]).mean().item(), 5))
                       for k, v in stats.items()}
            print(f"  {start + n}/{N} tokens, {time.perf_counter() - t1:.0f}s (top1, kl_mean) so far {running}",
                  file=sys.stderr, flush=True)
    res = {}
    for name, s in stats.items():
        kl = torch.cat(s["kl"]).clamp_min(0)
        res[name] = {"top1_agreement": round(s["top1"] / N, 4), "kl_mean": round(kl.mean().item(), 5),
                     "kl_p99": round(kl.quantile(0.99).item(), 4), "kl_max": round(kl.max().item(), 4),
                     "kv_bytes_per_token": caches[name].nbytes // N}
    print(json.dumps({
        "model": os.path.basename(path), "arch": gf.arch, "head_dim": cfg.head_dim, "kv_heads": cfg.n_kv_heads,
        "layers": cfg.n_layers, "text": f"python{platform.python_version()} stdlib {args.text_module}.py source",
        "positions": N, "chunk": args.chunk, "reference": "f32 KV cache (fp32 model on CPU)",
        "f32_kv_bytes_per_token": caches["f32"].nbytes // N, "results": res,
        "load_s": round(load_s, 1), "run_s": round(time.perf_counter() - t1, 1),
        "threads": torch.get_num_threads(), "machine": platform.processor() or platform.machine(),
    }, indent=1))


if __name__ == "__main__":
    main()
