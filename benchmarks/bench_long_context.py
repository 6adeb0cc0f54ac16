"""Long context in a 24 GB card: prefill + decode at a long prompt with a quantized KV cache, the planner's
predicted peak against the measured one, and decode speed at several context lengths.

    python -m dflash24.synth --preset qwen35-27b --out /root/q35.gguf
    python benchmarks/bench_long_context.py /root/q35.gguf --kv q4_0 --ctx 131072 --draft-type Q8_0
    python benchmarks/bench_long_context.py /root/q35.gguf --kv tq3 --ctx 262144 --draft-type Q4_K --prepare
    python benchmarks/bench_long_context.py /root/q35.gguf --kv tq3 --ctx 262144 --draft-type Q4_K --embed-on-host
    python benchmarks/bench_long_context.py /root/q35.gguf --kv q4_0 --ctx 32832 --spec ar --decode-at 8192

The card is emulated with the per-process memory fraction (`--gpu-mem`, default 23.42 GiB). A random 5-layer
drafter of the z-lab 27B drafter's shape (`--draft-type` BF16 z-lab directory, or a Q8_0 / Q4_K GGUF when BF16
does not fit; `--draft-layers 0` for none) is written under /root (`--work`; `--prepare` only writes it) and
loaded by the engine from EngineConfig.draft, as a user's drafter is. The long prompt fills the context minus
the generated tokens and runs through Engine.generate in `--spec` mode (tree by default: the drafter's cache,
feature ring, tree scratch and graphs all live); `--decode-at` runs time the target's own decode (AR) after
shorter prompts. Prints a JSON line per stage, then the report.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402

from bench_spec import GiB, draft_config, emulate_card  # noqa: E402


def write_random_drafter(dcfg, draft_type: str, work: str) -> str:
    """A random drafter of config `dcfg` in the format a user would load: z-lab directory (BF16) or GGUF."""
    from dflash24.models.drafter import random_state_dict, save_dir, save_gguf
    name = f"draft_{dcfg.n_layers}L_{dcfg.dim}_{draft_type}"
    path = os.path.join(work, name if draft_type == "BF16" else name + ".gguf")
    if not os.path.exists(path):
        sd = random_state_dict(dcfg, 0, torch.bfloat16)
        if draft_type == "BF16":
            save_dir(dcfg, sd, path)
        else:
            save_gguf(dcfg, sd, path, draft_type)
    return path


def memory_now() -> dict:
    """The allocator's current and peak figures (GiB): where an allocated / reserved gap opens."""
    return {k: round(v / GiB, 3) for k, v in (
        ("allocated", torch.cuda.memory_allocated()), ("reserved", torch.cuda.memory_reserved()),
        ("max_allocated", torch.cuda.max_memory_allocated()), ("max_reserved", torch.cuda.max_memory_reserved()))}


def segment_summary(top: int = 8) -> dict:
    """The caching allocator's segments per memory pool (the default pool and each CUDA graph's private one):
    count, reserved and allocated MiB, the largest free block, and the `top` largest segments with the bytes
    allocated in them -- a reserved-but-idle segment shows as a large total with little allocated."""
    pools: dict = {}
    segs = torch.cuda.memory_snapshot()
    for seg in segs:
        d = pools.setdefault(str(tuple(seg.get("segment_pool_id", (0, 0)))),
                             {"segments": 0, "reserved_MiB": 0.0, "allocated_MiB": 0.0, "largest_free_MiB": 0.0})
        d["segments"] += 1
        d["reserved_MiB"] += seg["total_size"] / 2**20
        d["allocated_MiB"] += seg["allocated_size"] / 2**20
        free = [b["size"] for b in seg["blocks"] if b["state"] == "inactive"]
        d["largest_free_MiB"] = max(d["largest_free_MiB"], max(free, default=0) / 2**20)
    for d in pools.values():
        for k in ("reserved_MiB", "allocated_MiB", "largest_free_MiB"):
            d[k] = round(d[k], 1)
    big = sorted(segs, key=lambda g: -g["total_size"])[:top]
    return {"pools": pools, "largest_segments_MiB": [
        [round(g["total_size"] / 2**20, 1), round(g["allocated_size"] / 2**20, 1)] for g in big]}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("gguf")
    ap.add_argument("--gpu-mem", type=float, default=23.42, help="emulated card size in GiB")
    ap.add_argument("--kv", default="q4_0", help="KV cache type for K and V")
    ap.add_argument("--ctx", type=int, default=131072)
    ap.add_argument("--draft-layers", type=int, default=5)
    ap.add_argument("--draft-type", default="BF16", choices=("BF16", "Q8_0", "Q4_K"))
    ap.add_argument("--spec", default="tree", choices=("ar", "chain", "tree"), help="mode of the long run")
    ap.add_argument("--embed-on-host", action="store_true")
    ap.add_argument("--work", default="/root", help="where the random drafter is written")
    ap.add_argument("--prepare", action="store_true", help="only write the random drafter (a separate, earlier call)")
    ap.add_argument("--gen", type=int, default=32, help="tokens generated after the long prompt")
    ap.add_argument("--decode-at", default="", help="also time decode after prompts of these lengths")
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    from dflash24.config import EngineConfig, SamplingParams
    from dflash24.engine import Engine
    from dflash24.plan import format_plan

    dev = torch.device(args.device)
    rep: dict = {"file": args.gguf, "kv": args.kv, "ctx": args.ctx, "errors": {}}
    cuda = dev.type == "cuda"
    if cuda:
        free0, total = torch.cuda.mem_get_info()
        emulate_card(args.gpu_mem)
        rep["device"] = {"name": torch.cuda.get_device_name(0), "emulated_GiB": args.gpu_mem,
                         "used_before_GiB": round((total - free0) / GiB, 3)}
    from dflash24.gguf.reader import GGUFFile
    from dflash24.models.qwen35 import Qwen35Config
    draft_path = None
    if args.draft_layers:
        dcfg = draft_config(Qwen35Config.from_gguf(GGUFFile(args.gguf)), args.draft_layers, args.ctx)
        draft_path = write_random_drafter(dcfg, args.draft_type, args.work)
    spec = args.spec if draft_path else "ar"
    cfg = EngineConfig(model=args.gguf, draft=draft_path, ctx=args.ctx, device=args.device, cache_type_k=args.kv,
                       cache_type_v=args.kv, spec=spec, embed_on_host=args.embed_on_host, prefix_cache=False)
    from dflash24.plan import fused_attention_available, plan
    p = plan(GGUFFile(args.gguf), draft_path, ctx=args.ctx, cache_type_k=args.kv, cache_type_v=args.kv,
             gpu_mem_bytes=int(args.gpu_mem * GiB), spec=spec, prefix_cache_mb=0, embed_on_host=args.embed_on_host,
             attention="fused" if fused_attention_available() else "math")
    rep["planned_total_GiB"] = round(p.total / GiB, 3)
    rep["planned_fits"] = p.fits
    rep["plan"] = format_plan(p)
    print(json.dumps({"stage": "drafter written", "path": draft_path}), flush=True)
    if args.prepare:
        return 0
    t = time.perf_counter()
    eng = Engine(cfg)
    rep["load_s"] = round(time.perf_counter() - t, 1)
    # the chunk the engine resolved from its own check (free memory under the per-process cap), which is what runs;
    # the plan above is this script's own, against --gpu-mem
    rep["engine_prefill_chunk"] = eng.config.prefill_chunk
    rep["planned_prefill_chunk"] = p.settings["prefill_chunk"]
    rep["memory_stages"] = {"loaded": memory_now()} if cuda else {}
    print(json.dumps({"stage": "loaded", "load_s": rep["load_s"], "planned_total_GiB": rep["planned_total_GiB"],
                      **rep["memory_stages"]}), flush=True)
    vocab = min(eng.model.cfg.vocab_size, 200_000)

    def run(prompt_len: int, gen: int, mode: str) -> dict:
        """decode_tokens_per_s: the engine's own figure (all decode steps, including the first step's CUDA-graph
        capture / kernel compiles at a new KV-row bucket); steady_decode_tokens_per_s: the second half of the
        tokens only, from the arrival times of the streamed events."""
        eng.spec_mode = mode
        prompt = torch.randint(0, vocab, (prompt_len,)).tolist()
        t = time.perf_counter()
        events, arrivals = [], []
        for ev in eng.generate(prompt, SamplingParams(max_tokens=gen, ignore_eos=True)):
            if not events and cuda:
                rep["memory_stages"][f"prefilled_{prompt_len}"] = memory_now()
            events.append(ev)
            arrivals.append((time.perf_counter(), len(ev.token_ids)))
        st = events[-1].stats.as_dict()
        half = len(arrivals) // 2
        steady = None
        if 0 < half < len(arrivals) - 1:
            n = sum(k for _, k in arrivals[half + 1:])
            steady = round(n / (arrivals[-1][0] - arrivals[half][0]), 2)
        return {"prompt": prompt_len, "spec": mode, "prefill_s": st["prefill_s"],
                "prefill_tokens_per_s": st["prefill_tokens_per_s"], "decode_tokens_per_s": st["tokens_per_s"],
                "steady_decode_tokens_per_s": steady, "wall_s": round(time.perf_counter() - t, 1)}

    try:
        rep["long"] = run(args.ctx - args.gen, args.gen, spec)
        print(json.dumps({"stage": "long", **rep["long"], "max_reserved_GiB":
                          round(torch.cuda.max_memory_reserved() / GiB, 3) if cuda else None}), flush=True)
    except Exception as e:  # noqa: BLE001 - report OOM or anything else, then the memory
        rep["errors"]["long"] = f"{type(e).__name__}: {str(e).splitlines()[0]}"
        traceback.print_exc(file=sys.stderr)
    for n in [int(x) for x in args.decode_at.split(",") if x]:
        try:
            rep[f"decode_at_{n}"] = run(min(n, args.ctx - args.gen), args.gen, "ar")
        except Exception as e:  # noqa: BLE001
            rep["errors"][f"decode_at_{n}"] = f"{type(e).__name__}: {str(e).splitlines()[0]}"
    if cuda:
        free1, total1 = torch.cuda.mem_get_info()
        rep["memory"] = {"max_allocated_GiB": round(torch.cuda.max_memory_allocated() / GiB, 3),
                         "max_reserved_GiB": round(torch.cuda.max_memory_reserved() / GiB, 3),
                         "device_used_GiB_incl_context": round((total1 - free1) / GiB, 3)}
        # peak = the allocator's peak reservation + all device memory that is not PyTorch's: this process's CUDA
        # context (already there at start: used_before, ~0.5 GiB), modules, cuBLAS workspace -- as the planner
        # counts them (on the dedicated device machine no other process holds GPU memory)
        non_torch = (total1 - free1 - torch.cuda.memory_reserved()) / GiB
        rep["memory"]["non_torch_GiB_incl_context"] = round(non_torch, 3)
        rep["memory"]["measured_peak_GiB"] = round(torch.cuda.max_memory_reserved() / GiB + non_torch, 3)
        rep["memory"]["planned_over_measured"] = round(p.total / GiB / rep["memory"]["measured_peak_GiB"], 3)
        rep["memory_stages"]["end"] = memory_now()
        rep["segments"] = segment_summary()
    print(json.dumps(rep))
    return 0 if not rep["errors"] else 1


if __name__ == "__main__":
    sys.exit(main())
