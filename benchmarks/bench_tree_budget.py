"""DDTree verify cost against one AR decode step, for several node budgets, in one run (CUDA graphs).

    python -m dflash24.synth --preset qwen35-27b --out /root/q35.gguf
    python benchmarks/bench_tree_budget.py /root/q35.gguf --budgets 8,15,16,22,32,64 [--gpu-mem 24]

For each budget B: ms of the draft step + tree build, of the target's verify of B+1 nodes, their ratio to an
AR step, and the peak memory a tree step adds over an AR step. A random BF16 drafter of the target's width is
built on the GPU. --gpu-mem G emulates a card of G GiB.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402

from bench_spec import GiB, attach_random_drafter, emulate_card, timed  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("gguf")
    ap.add_argument("--budgets", default="8,16,22,32,64")
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--pos", type=int, default=512)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--gpu-mem", type=float, default=None, help="emulate a card of this many GiB")
    args = ap.parse_args()
    if args.gpu_mem:
        emulate_card(args.gpu_mem)
    budgets = [int(b) for b in args.budgets.split(",")]
    from dflash24.config import EngineConfig
    from dflash24.engine import Engine
    eng = Engine(EngineConfig(model=args.gguf, ctx=args.ctx, device="cuda", ddtree_budget=max(budgets)))
    attach_random_drafter(eng, 5, args.ctx, "tree")
    runner, draft = eng.runner, eng.draft_runner
    rep = {"device": torch.cuda.get_device_name(0), "emulated_GiB": args.gpu_mem, "at_context": args.pos}
    ids = torch.randint(0, 200_000, (args.pos,), device="cuda")
    logits = runner.prefill(ids, 0, 512, draft.add_context)
    tok = logits.argmax(-1).view(1)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    ar = timed(lambda: runner.decode(tok, args.pos), args.iters)
    base_peak = torch.cuda.max_memory_allocated()
    rep["ar_ms"] = round(ar, 3)
    rows = []
    for b in budgets:
        torch.cuda.reset_peak_memory_stats()
        tree = draft.draft_tree(tok, args.pos, b)
        dt = timed(lambda: draft.draft_tree(tok, args.pos, b), args.iters)
        vt = timed(lambda: runner.forward_tree(tree, args.pos), args.iters)
        rows.append({"budget": b, "draft_and_build_ms": round(dt, 3), "verify_ms": round(vt, 3),
                     "verify_over_ar": round(vt / ar, 3), "step_over_ar": round((dt + vt) / ar, 3),
                     "peak_added_GiB": round((torch.cuda.max_memory_allocated() - base_peak) / GiB, 3)})
        print(json.dumps(rows[-1]), flush=True)
    rep["budgets"] = rows
    print(json.dumps(rep))
    return 0


if __name__ == "__main__":
    sys.exit(main())
