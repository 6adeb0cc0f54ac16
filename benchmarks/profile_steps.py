"""Where the time of one target step goes: CUDA kernel time per kernel name (torch.profiler) for an AR
decode step, a 16-token speculative verify step and a tree verify step (budget 22), and on request a random
drafter's draft step (`--kinds draft`), eager (no CUDA graph, so every kernel is visible).

    python benchmarks/profile_steps.py /root/q35.gguf [--steps 5] [--top 25] [--grids]

Prints one JSON object: per step kind, the summed kernel time per step, the number of kernels per step,
and the top kernels by time (name, calls per step, us per step, share). Kernel time excludes launch gaps,
so (graph step time - kernel time) is what the CUDA graph still loses between kernels.

Programmatic dependent launch is off here unless DFLASH24_PDL is set: with it, a kernel's span includes its wait for
the kernel before, which the table would count as that kernel's time (2026-12-02: 4.6 ms of split-K sums a verify
step with it, 1.06 ms without).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

from bench_spec import kernel_table  # noqa: E402
from dflash24.kernels import pdl  # noqa: E402

if "DFLASH24_PDL" not in os.environ:    # at the module, not the environment: a wrapper may have imported it already
    pdl.ENABLED = False


def _grid_table(trace: dict, steps: int, sms: int, top: int) -> dict:
    """Launch shapes per kernel name from a Kineto trace (`prof.export_chrome_trace`'s JSON): launches a step, programs
    (CUDA blocks) a launch, smallest and largest, threads and registers a thread, and the trace's occupancy estimate
    where it gives one; `underfilled`: the kernels whose launches have fewer programs than the GPU has SMs, by their
    time a step (the ones that leave SMs idle: what the session of 2026-12-06 09:34 found in the split-K sums and the
    norms)."""
    by_name: dict = {}
    for ev in trace.get("traceEvents", []):
        if str(ev.get("cat", "")).lower() != "kernel" or "args" not in ev:      # "Kernel" in older Kineto
            continue
        a = ev["args"]
        grid, block = a.get("grid") or [1, 1, 1], a.get("block") or [1, 1, 1]
        programs = grid[0] * grid[1] * grid[2]
        rec = by_name.setdefault(ev.get("name", "?")[:90], dict(launches=0, us=0.0, programs=[], threads=set(),
                                                               occupancy=set(), registers=set()))
        rec["launches"] += 1
        rec["us"] += float(ev.get("dur", 0.0))
        rec["programs"].append(programs)
        rec["threads"].add(block[0] * block[1] * block[2])
        if "est. achieved occupancy %" in a:
            rec["occupancy"].add(a["est. achieved occupancy %"])
        if "registers per thread" in a:
            rec["registers"].add(a["registers per thread"])
    rows = [{"name": n, "launches": round(r["launches"] / steps, 1), "us": round(r["us"] / steps, 1),
             "programs_min": min(r["programs"]), "programs_max": max(r["programs"]),
             "threads": sorted(r["threads"]), "registers": sorted(r["registers"]),
             "occupancy_pct": sorted(r["occupancy"])}
            for n, r in sorted(by_name.items(), key=lambda kv: -kv[1]["us"])]
    return {"sms": sms, "kernels": rows[:top], "underfilled": [r for r in rows if r["programs_min"] < sms][:top]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("gguf")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--pos", type=int, default=512)
    ap.add_argument("--budget", default="22",
                    help="the tree verify's node budget (budget + 1 nodes); several, comma-separated, profile each")
    ap.add_argument("--kinds", default="decode,verify16,tree",
                    help="which steps to profile (comma-separated): decode, verify16, tree, draft (the drafter's "
                         "16-row block with its LM head)")
    ap.add_argument("--draft-layers", type=int, default=5, help="layers of the random drafter (kind draft)")
    ap.add_argument("--draft-type", default="BF16", choices=("BF16", "Q8_0", "Q6_K", "Q4_K"))
    ap.add_argument("--prefill", type=int, default=0,
                    help="also profile one prefill of this many tokens (in the engine's prefill chunks)")
    ap.add_argument("--grids", action="store_true",
                    help="also report each kernel's launch shapes (programs a launch, threads, occupancy) from the "
                         "profiler's trace, and the kernels launched with fewer programs than SMs")
    args = ap.parse_args()

    from torch.profiler import ProfilerActivity, profile

    from dflash24.config import EngineConfig
    from dflash24.engine import Engine

    from bench_spec import attach_random_drafter

    engine = Engine(EngineConfig(model=args.gguf, ctx=args.ctx, device="cuda", cuda_graphs=False))
    kinds = args.kinds.split(",")
    # a random drafter: the draft step's own (kind draft), else one layer, only so that the target cache gets its
    # speculative rows (verify steps)
    attach_random_drafter(engine, args.draft_layers if "draft" in kinds else 1, args.ctx, "chain",
                          draft_type=args.draft_type)
    runner = engine.runner
    vocab = engine.model.cfg.vocab_size
    ids = torch.randint(0, min(vocab, 200_000), (args.pos,), device="cuda")
    runner.prefill(ids, 0, engine.config.prefill_chunk, engine.draft_runner.add_context)
    tok = torch.zeros(1, dtype=torch.long, device="cuda")
    block = torch.zeros(16, dtype=torch.long, device="cuda")
    report = {}
    steps = [("decode", lambda: runner.decode(tok, args.pos), args.steps),
             ("verify16", lambda: runner.forward_fixed(block, args.pos, speculative=True), args.steps),
             ("draft", lambda: engine.draft_runner.draft(tok, args.pos), args.steps)]
    steps = [s for s in steps if s[0] in kinds]
    for budget in (int(b) for b in args.budget.split(",")) if "tree" in kinds else ():
        tree = engine.draft_runner.draft_tree(tok, args.pos, budget)
        steps.append((f"tree_verify{budget + 1}", lambda tree=tree: runner.forward_tree(tree, args.pos), args.steps))
    if args.prefill:
        long_ids = torch.randint(0, min(vocab, 200_000), (args.prefill,), device="cuda")
        steps.append((f"prefill{args.prefill}", lambda: runner.prefill(long_ids, 0, engine.config.prefill_chunk), 1))
    for name, fn, n in steps:
        for _ in range(1 if name.startswith("prefill") else 3):
            fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(n):
                fn()
            torch.cuda.synchronize()
        report[name] = kernel_table(prof, n, args.top)
        if args.grids:
            with tempfile.TemporaryDirectory() as tmp:
                path = os.path.join(tmp, "trace.json")
                prof.export_chrome_trace(path)
                with open(path) as f:
                    trace = json.load(f)
            report[name]["grids"] = _grid_table(trace, n, torch.cuda.get_device_properties(0).multi_processor_count,
                                                args.top)
        print(json.dumps({name: report[name]}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
