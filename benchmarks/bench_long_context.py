"""Long context in a 24 GB card: prefill + decode at a long prompt with a quantized KV cache, the planner's
predicted peak against the measured one, and decode speed at several context lengths.

    python -m dflash24.synth --preset qwen35-27b --out /root/q35.gguf
    python benchmarks/bench_long_context.py /root/q35.gguf --gpu-mem 23.42 --kv q4_0 --ctx 131072
    python benchmarks/bench_long_context.py /root/q35.gguf --gpu-mem 23.42 --kv tq3 --ctx 262144
    python benchmarks/bench_long_context.py /root/q35.gguf --gpu-mem 23.42 --kv q4_0 --ctx 131072 --decode-at 8192,32768,131000

A random BF16 5-layer drafter of the target's width is attached (`--draft-layers 0` for none). The prompt
fills the context minus the generated tokens; prefill and decode go through Engine.generate (AR mode, so the
numbers are the target's) and the drafter still holds its cache and weights. Prints JSON.
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

from bench_spec import GiB, draft_config  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("gguf")
    ap.add_argument("--gpu-mem", type=float, default=23.42, help="emulated card size in GiB")
    ap.add_argument("--kv", default="q4_0", help="KV cache type for K and V")
    ap.add_argument("--ctx", type=int, default=131072)
    ap.add_argument("--draft-layers", type=int, default=5)
    ap.add_argument("--gen", type=int, default=32, help="tokens generated after the long prompt")
    ap.add_argument("--decode-at", default="", help="also time decode after prompts of these lengths")
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    from dflash24.config import EngineConfig, SamplingParams
    from dflash24.engine import Engine
    from dflash24.models.drafter import DFlashDrafter, random_state_dict
    from dflash24.plan import format_plan

    dev = torch.device(args.device)
    rep: dict = {"file": args.gguf, "kv": args.kv, "ctx": args.ctx, "errors": {}}
    cuda = dev.type == "cuda"
    if cuda:
        free0, total = torch.cuda.mem_get_info()
        torch.cuda.set_per_process_memory_fraction(min(1.0, args.gpu_mem * GiB / total))
        rep["device"] = {"name": torch.cuda.get_device_name(0), "emulated_GiB": args.gpu_mem,
                         "used_before_GiB": round((total - free0) / GiB, 3)}
    cfg = EngineConfig(model=args.gguf, ctx=args.ctx, device=args.device, cache_type_k=args.kv,
                       cache_type_v=args.kv, spec="ar")
    eng = Engine(cfg)
    if args.draft_layers:
        dcfg = draft_config(eng.model.cfg, args.draft_layers, args.ctx)
        sd = random_state_dict(dcfg, 0, torch.bfloat16 if cuda else torch.float32, args.device)
        eng.attach_drafter(DFlashDrafter.from_state_dict(dcfg, sd, args.device, eng.dtype, args.ctx + 64), "ar")
        del sd
    from dflash24.plan import DraftShape, plan
    draft = DraftShape.from_config(dcfg, "BF16") if args.draft_layers else None
    p = plan(eng.gguf, draft, ctx=args.ctx, cache_type_k=args.kv, cache_type_v=args.kv,
             gpu_mem_bytes=int(args.gpu_mem * GiB), spec="ar", prefix_cache_mb=0)
    rep["planned_total_GiB"] = round(p.total / GiB, 3)
    rep["plan"] = format_plan(p)
    vocab = min(eng.model.cfg.vocab_size, 200_000)

    def run(prompt_len: int, gen: int) -> dict:
        prompt = torch.randint(0, vocab, (prompt_len,)).tolist()
        t = time.perf_counter()
        events = list(eng.generate(prompt, SamplingParams(max_tokens=gen, ignore_eos=True)))
        st = events[-1].stats.as_dict()
        return {"prompt": prompt_len, "prefill_s": st["prefill_s"], "prefill_tokens_per_s": st["prefill_tokens_per_s"],
                "decode_tokens_per_s": st["tokens_per_s"], "wall_s": round(time.perf_counter() - t, 1)}

    try:
        rep["long"] = run(args.ctx - args.gen, args.gen)
    except Exception as e:  # noqa: BLE001 - report OOM or anything else, then the memory
        rep["errors"]["long"] = f"{type(e).__name__}: {str(e).splitlines()[0]}"
        traceback.print_exc(file=sys.stderr)
    for n in [int(x) for x in args.decode_at.split(",") if x]:
        try:
            rep[f"decode_at_{n}"] = run(min(n, args.ctx - args.gen), args.gen)
        except Exception as e:  # noqa: BLE001
            rep["errors"][f"decode_at_{n}"] = f"{type(e).__name__}: {str(e).splitlines()[0]}"
    if cuda:
        free1, total1 = torch.cuda.mem_get_info()
        rep["memory"] = {"max_allocated_GiB": round(torch.cuda.max_memory_allocated() / GiB, 3),
                         "max_reserved_GiB": round(torch.cuda.max_memory_reserved() / GiB, 3),
                         "device_used_GiB_incl_context": round((total1 - free1) / GiB, 3)}
    print(json.dumps(rep))
    return 0 if not rep["errors"] else 1


if __name__ == "__main__":
    sys.exit(main())
