"""Triton cache attention vs the SDPA (math backend) path on a CUDA GPU.

    python benchmarks/bench_attention.py [--quick] [--sweep] [--heads 24 --kv-heads 4 --head-dim 256]
                                         [--json-out FILE] [--kv bf16,q8_0,q4_0,tq3] [--steps-at 32768,131072]
                                         [--max-splits N]

Cases (qwen35 attention shape by default: 24 query heads, 4 KV heads, head dim 256, bf16 cache):
decode T=1 at 4K / 32K / 128K context; chain verify T=16 and tree verify T=23 at 4K; prefill chunk
T=512 at 4K and 32K (the chunk's queries are the last 512 rows of the context).
For each: time per call (median of 5 CUDA-graph replays; a graph cycles over enough cache copies that
the K/V bytes of one call are not in L2 from the previous call), peak extra memory of one call
(torch.cuda.max_memory_allocated above the resident tensors), KV bytes read per second for the kernel,
the SDPA-math path as layers.cache_attention ran it before (dense [T, S] bool mask built once outside the
timed region, enable_gqa), and the max |triton - sdpa| difference.
--sweep: also times a few tile configs / split counts per case and reports the fastest (for pick_config);
--sweep-grid sets its axes (BLOCK_M too), --only keeps the cases named.
--kv: the cache types to time (a quantized cache is built by cache/kvquant.encode; kv_bytes counts its packed
rows; no SDPA reference for those); --steps-at: instead of the cases above, decode / chain verify 16 / tree
verify 23 with the step's rows at the end of each of these contexts; --max-splits: kernels.attention.MAX_SPLITS
for this run (the split-KV partials merged in one reduce tile).
Prints one JSON object.
"""
from __future__ import annotations

import argparse
import json
import sys
import traceback
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dflash24.cache import kvquant  # noqa: E402
from dflash24.kernels import attention as A  # noqa: E402  (--module: another copy, for an A/B in one process)

L2_FLUSH_BYTES = 256 << 20


def time_graph(fns, repeats: int = 5, min_ms: float = 20.0) -> float:
    """Median seconds per call of `fns` (each called once per round, round robin) replayed in a CUDA graph."""
    for f in fns:
        f()
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for f in fns:
            f()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for f in fns:
            f()
    g.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    g.replay()
    end.record()
    torch.cuda.synchronize()
    one = max(start.elapsed_time(end), 1e-3)
    reps = max(1, int(min_ms / one))
    times = []
    for _ in range(repeats):
        start.record()
        for _ in range(reps):
            g.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / reps / len(fns))
    times.sort()
    return times[len(times) // 2]


def peak_bytes(fn) -> int:
    """Peak memory allocated during fn() above what was allocated before it."""
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    del out
    return int(peak)


def sdpa_math(q, k_cache, v_cache, mask, scale, kv_rows):
    """The pre-kernel layers.cache_attention body (SDPA with a dense bool mask and enable_gqa)."""
    k = k_cache[:kv_rows].transpose(0, 1)
    v = v_cache[:kv_rows].transpose(0, 1)
    out = F.scaled_dot_product_attention(q.transpose(0, 1).unsqueeze(0).to(k.dtype), k.unsqueeze(0),
                                         v.unsqueeze(0), attn_mask=mask, scale=scale,
                                         enable_gqa=q.shape[1] != k.shape[0])
    return out.squeeze(0).transpose(0, 1).to(q.dtype)


def random_ancestors(n: int, gen) -> torch.Tensor:
    anc = torch.eye(n, dtype=torch.bool)
    for i in range(1, n):
        anc[i] |= anc[int(torch.randint(0, i, (1,), generator=gen))]
    return anc


def row_bytes(kv: str, D: int) -> int:
    """Bytes of one cache row of one KV head: a packed row for a quantized type, D values for a dense one."""
    return kvquant.row_bytes(kv, D) if kv in kvquant.QUANT_TYPES else D * kvquant.DENSE_TYPES[kv].itemsize


def cache_copies(kv_bytes: int) -> int:
    """Cache copies a timed graph cycles over so that one call's K / V bytes are out of L2 by its next turn."""
    return max(1, min(8, -(-L2_FLUSH_BYTES // kv_bytes)))


def make_cache(kv: str, rows: int, Hk: int, D: int, dev: str):
    x = torch.randn(rows, Hk, D, device=dev, dtype=torch.bfloat16)
    if kv in kvquant.DENSE_TYPES:
        return x.to(kvquant.DENSE_TYPES[kv])
    return kvquant.PackedKV(kvquant.encode(x, kv), kv, D)


def run_case(name, T, ctx, args, tree=False, bucket=None, kv="bf16"):
    dev, dt = "cuda", torch.bfloat16
    H, Hk, D = args.heads, args.kv_heads, args.head_dim
    gen = torch.Generator().manual_seed(0)
    # the step's rows end exactly at the context end; `bucket`: kv_rows as the engine passes it (runner.kv_bucket)
    kv_rows = bucket or ctx
    kv_bytes = kv_rows * Hk * row_bytes(kv, D) * 2      # K and V read once
    copies = cache_copies(kv_bytes)
    caches = [(make_cache(kv, kv_rows, Hk, D, dev), make_cache(kv, kv_rows, Hk, D, dev)) for _ in range(copies)]
    q = torch.randn(T, H, D, generator=gen).to(dev, dt)
    scale = D ** -0.5
    if tree:
        base = torch.tensor([ctx - T], device=dev)
        anc = random_ancestors(T, gen).to(dev)
        kw = dict(base=base, ancestors=anc)
    else:
        kw = dict(slots=torch.arange(ctx - T, ctx, device=dev))
    mask = A.dense_visibility(T, kv_rows, device=dev, **kw)          # built once, outside the timing
    fmt = kvquant.FORMAT_CODE.get(kv, 0)                 # the tiles a step (not a quantized prompt chunk) picks
    base_cfg = A.pick_config(T, H // Hk, D, formats=(fmt, fmt), shared=A._limits(q.device)[1], tree=tree,
                             kv_rows=kv_rows)
    res = dict(case=name, kv=kv, T=T, context=ctx, kv_rows=kv_rows, tree=tree, kv_bytes=kv_bytes, cache_copies=copies)

    def tri(extra=None):
        return [lambda k=k, v=v: A.attention(q, k, v, scale, kv_rows, **kw, **(extra or {})) for k, v in caches]

    try:
        t = time_graph(tri())
        res["triton_us"] = t * 1e6
        res["triton_kv_GBps"] = kv_bytes / t / 1e9
        res["triton_peak_MiB"] = peak_bytes(lambda: A.attention(q, *caches[0], scale, kv_rows, **kw)) / 2 ** 20
        res["triton_config"] = base_cfg
    except Exception as e:  # noqa: BLE001
        res["triton_error"] = f"{type(e).__name__}: {e}"
        traceback.print_exc(file=sys.stderr)
    if not args.no_sdpa and kv not in kvquant.QUANT_TYPES:
        try:
            res["sdpa_peak_MiB"] = peak_bytes(lambda: sdpa_math(q, *caches[0], mask, scale, kv_rows)) / 2 ** 20
            ts = time_graph([lambda k=k, v=v: sdpa_math(q, k, v, mask, scale, kv_rows) for k, v in caches[:2]],
                            repeats=3)
            res["sdpa_us"] = ts * 1e6
            if "triton_us" in res:
                res["speedup"] = ts / (res["triton_us"] / 1e6)
                o = A.attention(q, *caches[0], scale, kv_rows, **kw)
                ref = sdpa_math(q, *caches[0], mask, scale, kv_rows)
                res["max_abs_diff_vs_sdpa"] = (o.float() - ref.float()).abs().max().item()
        except Exception as e:  # noqa: BLE001 (OOM at long context is a result, not a failure)
            res["sdpa_error"] = f"{type(e).__name__}: {str(e)[:200]}"
        torch.cuda.empty_cache()
    if args.splits and "triton_us" in res:
        res["splits_us"] = {}
        for sp in (int(v) for v in args.splits.split(",")):
            try:
                res["splits_us"][sp] = round(time_graph(tri(dict(n_splits=sp)), repeats=3, min_ms=5) * 1e6, 2)
            except Exception as e:  # noqa: BLE001 (more splits than MAX_SPLITS, out of memory)
                res["splits_us"][sp] = f"{type(e).__name__}: {str(e)[:80]}"
    if args.sweep and "triton_us" in res:
        trials = []
        axes = {**dict(M=(base_cfg["BLOCK_M"],), N=(32, 64, 128), W=(4, 8),
                       S=(1, 2, 3) if kv in kvquant.QUANT_TYPES else (2, 3)), **args.sweep_grid}
        grid = [dict(base_cfg, BLOCK_M=bm, BLOCK_N=bn, num_warps=w, num_stages=st, n_splits=None)
                for bm in axes["M"] for bn in axes["N"] for w in axes["W"] for st in axes["S"]]
        if T * (H // Hk) <= 256:                    # split-KV counts, at the default tiles
            grid += [dict(base_cfg, n_splits=sp) for sp in (4, 8, 16, 32, 64, 128, 256) if sp <= A.MAX_SPLITS]
        for cfg in grid:
            cfg = dict(cfg)
            splits = cfg.pop("n_splits")
            try:
                t = time_graph(tri(dict(config=cfg, n_splits=splits)), repeats=3, min_ms=5)
                trials.append(dict(cfg, n_splits=splits, us=t * 1e6))
            except Exception as e:  # noqa: BLE001 (out of shared memory etc.)
                trials.append(dict(cfg, n_splits=splits, error=type(e).__name__))
        ok = sorted((x for x in trials if "us" in x), key=lambda x: x["us"])
        res["sweep_best"] = ok[:3]
    del caches
    torch.cuda.empty_cache()
    return res


def _grid(text: str) -> dict:
    """"M=64,128;N=32" -> {"M": (64, 128), "N": (32,)} (--sweep-grid)."""
    out = {}
    for part in filter(None, text.split(";")):
        key, _, values = part.partition("=")
        if key not in ("M", "N", "W", "S") or not values:
            raise argparse.ArgumentTypeError(f"{part!r}: expected M=, N=, W= or S= with comma-separated integers")
        out[key] = tuple(int(v) for v in values.split(","))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="skip the 128K decode and 32K prefill cases")
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--sweep-grid", default="", type=_grid,
                    help='--sweep\'s axes, e.g. "M=64,128;N=32,64;W=8;S=1,2" (BLOCK_M, BLOCK_N, warps, stages); an '
                         'axis left out keeps its default (the case\'s BLOCK_M; N 32,64,128; W 4,8; S 1-3 or 2-3)')
    ap.add_argument("--only", default="", help="only these cases (comma-separated: decode, verify_chain, ...)")
    ap.add_argument("--no-sdpa", action="store_true")
    ap.add_argument("--heads", type=int, default=24)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--head-dim", type=int, default=256)
    ap.add_argument("--json-out")
    ap.add_argument("--short", action="store_true",
                    help="instead: decode / chain verify 16 / tree verify 23 right after a 512- and a 2048-token "
                         "prompt, with kv_rows the engine's bucket (1024, 4096), as the 27B step benchmarks run them")
    ap.add_argument("--splits", default="", help="also time these split-KV counts (comma-separated)")
    ap.add_argument("--kv", default="bf16", help="cache types (comma-separated): bf16, f16, q8_0, q4_0, tq3")
    ap.add_argument("--steps-at", default="", help="decode / verify 16 / tree 23 at these contexts instead")
    ap.add_argument("--max-splits", type=int, default=0, help="set kernels.attention.MAX_SPLITS for this run")
    ap.add_argument("--module", default="", help="time this copy of kernels/attention.py instead (e.g. "
                    "dflash24.kernels.attention_prev, another commit's, untracked)")
    args = ap.parse_args()
    global A
    if args.module:
        import importlib
        A = importlib.import_module(args.module)
    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU")
    if args.max_splits:
        A.MAX_SPLITS = args.max_splits
    cases = [("decode", 1, 4096, False), ("decode", 1, 32768, False), ("decode", 1, 131072, False),
             ("verify_chain", 16, 4096, False), ("verify_tree", 23, 4096, True),
             ("prefill_chunk", 512, 4096, False), ("prefill_chunk", 512, 32768, False)]
    if args.quick:
        cases = [c for c in cases if not (c[2] > 32768 or (c[1] == 512 and c[2] > 4096))]
    buckets = {}
    if args.short:
        cases = [(n, T, p + T, tr) for p in (512, 2048)
                 for n, T, tr in (("decode", 1, False), ("verify_chain", 16, False), ("verify_tree", 23, True))]
        buckets = {c[2]: 1024 if c[2] <= 1024 else 4096 for c in cases}
    if args.steps_at:
        cases = [(n, T, int(c), tr) for c in args.steps_at.split(",")
                 for n, T, tr in (("decode", 1, False), ("verify_chain", 16, False), ("verify_tree", 23, True))]
    if args.only:
        cases = [c for c in cases if c[0] in args.only.split(",")]
    import triton
    out = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
               heads=args.heads, kv_heads=args.kv_heads, head_dim=args.head_dim, dtype="bfloat16",
               max_splits=A.MAX_SPLITS, module=A.__name__, results=[])
    for kv in args.kv.split(","):
        for name, T, ctx, tree in cases:
            out["results"].append(run_case(name, T, ctx, args, tree, buckets.get(ctx), kv))
            print(json.dumps(out["results"][-1]), file=sys.stderr, flush=True)
    text = json.dumps(out, indent=1)
    print(text)
    if args.json_out:
        Path(args.json_out).write_text(text)


if __name__ == "__main__":
    main()
