"""Short-prompt prefill on CUDA: is it bound by the GPU or by the host launching its kernels? For each prompt
length, the median wall time of a prefill (the engine's prefill chunk), then one more under torch.profiler: the
summed CUDA kernel time and the number of kernels. wall / kernel time near 1: the GPU is the limit; well above 1:
the host (Python and launches) is, and the GPU waits between kernels. Also the peak memory a prefill adds, against
the memory plan's estimate for prefill activations.

    python benchmarks/bench_prefill.py /root/q35.gguf --gpu-mem 24 --tokens 128,256,512,1024,4096 [--spec ar]

Prints one JSON line per (setting, length). `--settings` runs every length again after each statement (module
attributes, as benchmarks/with_settings.py takes them: K = dflash24.quant.kernels, R = dflash24.runner, ...), in
the same process, so launch policies compare on one loaded model: e.g. --settings 'K.SCRATCH_BYTES=96<<20', or
--settings 'R.TILE_PREFILL_MAX = 0' (short prompts in eager chunks instead of replays of the verify step).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

from bench_spec import GiB, attach_random_drafter, emulate_card, kernel_table, memory_report  # noqa: E402


def _kernel_time(fn, top: int) -> dict:
    """`bench_spec.kernel_table` of one call of fn (the summed kernel time, the kernels, the top ones)."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return kernel_table(prof, 1, top)


def _host_profile(fn, top: int) -> list:
    """The top functions by own host time of one call of fn under cProfile: [file:line(name), calls, own ms,
    cumulative ms]."""
    import cProfile
    import pstats
    prof = cProfile.Profile()
    prof.enable()
    fn()
    torch.cuda.synchronize()
    prof.disable()
    stats = pstats.Stats(prof).stats
    rows = sorted(stats.items(), key=lambda kv: -kv[1][2])[:top]
    return [[f"{os.path.basename(f)}:{line}({name})", nc, round(tt * 1e3, 2), round(ct * 1e3, 2)]
            for (f, line, name), (_, nc, tt, ct, _) in rows]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("gguf")
    ap.add_argument("--gpu-mem", type=float, default=None, help="emulate a card of this many GiB")
    ap.add_argument("--ctx", type=int, default=8192)
    ap.add_argument("--tokens", default="128,256,512,1024,4096", help="prompt lengths")
    ap.add_argument("--reps", type=int, default=5, help="timed prefills a length (median)")
    ap.add_argument("--prefill-chunk", type=int, default=None)
    ap.add_argument("--top", type=int, default=0, help="also list the top kernels by time of each profiled prefill")
    ap.add_argument("--host-profile", type=int, default=0,
                    help="also run one prefill of each length under cProfile and list this many functions by "
                         "their own host time (where the host's time goes when it is the limit)")
    ap.add_argument("--spec", choices=["ar", "chain", "tree"], default="tree",
                    help="the decoding mode the engine is set up for (chain / tree: a random 5-layer BF16 drafter of "
                         "the published shape attached; short prompts then prefill as its verify step's replays)")
    ap.add_argument("--settings", action="append", default=[],
                    help="a statement run before timing every length again (repeatable; the first pass is as shipped)")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print(json.dumps({"error": "CUDA is not available"}))
        return 1
    if args.gpu_mem:
        emulate_card(args.gpu_mem)

    from gguf import GGMLQuantizationType as QT

    import dflash24.kernels.deltanet as DN
    import dflash24.kernels.norm as N
    import dflash24.models.layers as L
    import dflash24.quant.kernels as K
    import dflash24.runner as R
    from dflash24.config import EngineConfig
    from dflash24.engine import Engine

    kw = {"prefill_chunk": args.prefill_chunk} if args.prefill_chunk else {}
    t0 = time.perf_counter()
    engine = Engine(EngineConfig(model=args.gguf, ctx=args.ctx, device="cuda", **kw))
    if args.spec != "ar":
        attach_random_drafter(engine, 5, args.ctx, args.spec)
    planned = engine.plan.item("activations: prefill (eager)").bytes if engine.plan is not None else None
    print(json.dumps({"device": torch.cuda.get_device_name(), "load_s": round(time.perf_counter() - t0, 1),
                      "spec": engine.spec_mode, "tile": engine.runner.tile,
                      "prefill_chunk": engine.config.prefill_chunk,
                      "planned_prefill_GiB": round(planned / GiB, 3) if planned else None}), flush=True)
    runner, chunk = engine.runner, engine.config.prefill_chunk
    vocab = engine.model.cfg.vocab_size
    lengths = [int(x) for x in args.tokens.split(",") if x]

    for setting in ["", *args.settings]:
        if setting:
            exec(setting, {"K": K, "N": N, "L": L, "DN": DN, "R": R, "QT": QT})
        for n in lengths:
            if n + 8 > args.ctx:
                print(json.dumps({"settings": setting, "tokens": n, "skipped": f"longer than --ctx {args.ctx}"}))
                continue
            ids = torch.randint(0, min(vocab, 200_000), (n,), device="cuda")

            def prefill():
                return runner.prefill(ids, 0, chunk)
            prefill()                                             # warm-up: this length's shapes compiled
            torch.cuda.synchronize()
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            walls = []
            for _ in range(args.reps):
                t = time.perf_counter()
                prefill()
                torch.cuda.synchronize()
                walls.append(time.perf_counter() - t)
            wall = statistics.median(walls)
            peak_added = torch.cuda.max_memory_allocated() - base
            kt = _kernel_time(prefill, args.top)
            kernel_ms = kt["kernel_us_per_step"] / 1e3
            host = _host_profile(prefill, args.host_profile) if args.host_profile else None
            print(json.dumps({"settings": setting, "tokens": n, "wall_ms": round(wall * 1e3, 2),
                              "wall_ms_min_max": [round(min(walls) * 1e3, 2), round(max(walls) * 1e3, 2)],
                              "tokens_per_s": round(n / wall, 1), "kernel_ms": round(kernel_ms, 2),
                              "kernels": int(kt["kernels_per_step"]),
                              "tiles": runner.prefill_tile_count(n, 0), "tile": runner.tile,
                              "wall_over_kernel": round(wall * 1e3 / kernel_ms, 2) if kernel_ms else None,
                              "peak_added_GiB": round(peak_added / GiB, 3),
                              **({"top": kt["top"]} if args.top else {}), **({"host": host} if host else {})}),
                  flush=True)
    print(json.dumps({"memory": memory_report()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
