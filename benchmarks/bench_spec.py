"""Cost of one DFlash chain step against one AR decode step, measured in the same run (CUDA graphs).

    python -m dflash24.synth --preset qwen35-27b --out /root/q35.gguf
    python benchmarks/bench_spec.py /root/q35.gguf --gpu-mem 24 [--draft-layers 5]

A random BF16 drafter of the target's width (the Qwen3.6-27B DFlash shape for a 27B target) is built on the
GPU. Prints JSON: ms per AR step, draft step, verify step (16 tokens), commit, the drafter's context update as the
decode loop runs it (the step's feature rows, one graphed call), their ratio to the AR step (the break-even
acceptance length); the same for a DDTree step; end-to-end tok/s with the random drafter, and peak memory.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import traceback
from collections import defaultdict

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402

GiB = 1 << 30


def emulate_card(gib: float) -> int:
    """Cap this process at `gib` GiB of the GPU (a smaller card emulated on a larger one); returns the total bytes."""
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(min(1.0, gib * GiB / total))
    return total


def kernel_table(prof, steps: int, top: int) -> dict:
    """CUDA kernel time per kernel name of a torch.profiler run over `steps` steps: the summed kernel time and the
    number of kernels a step, and the `top` kernels by time (name, calls, us a step, share)."""
    by_name: dict = defaultdict(lambda: [0, 0.0])
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            rec = by_name[ev.name[:90]]
            rec[0] += 1
            rec[1] += ev.device_time if hasattr(ev, "device_time") else ev.cuda_time
    total = sum(v[1] for v in by_name.values())
    rows = sorted(by_name.items(), key=lambda kv: -kv[1][1])[:top]
    return {"kernel_us_per_step": round(total / steps, 1),
            "kernels_per_step": round(sum(v[0] for v in by_name.values()) / steps, 1),
            "top": [{"name": n, "calls": round(c / steps, 1), "us": round(t / steps, 1),
                     "share": round(t / total, 3)} for n, (c, t) in rows]}


def memory_report() -> dict:
    """This process's peak allocated and reserved GiB, and the device's used GiB (the CUDA context included)."""
    free, total = torch.cuda.mem_get_info()
    return {"max_allocated_GiB": round(torch.cuda.max_memory_allocated() / GiB, 3),
            "reserved_GiB": round(torch.cuda.memory_reserved() / GiB, 3),
            "device_used_GiB_incl_context": round((total - free) / GiB, 3)}


def timed(fn, iters: int, warmup: int = 3) -> float:
    """Mean ms per call (CUDA events around `iters` calls)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(iters):
        fn()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) / iters


def draft_config(target_cfg, n_layers: int, ctx: int):
    from dflash24.models.drafter import FULL, SLIDING, DFlashConfig, default_target_layer_ids
    big = target_cfg.dim == 5120
    types = (SLIDING,) * (n_layers - 1) + (FULL,)
    return DFlashConfig(
        n_layers=n_layers, dim=target_cfg.dim, ffn_dim=17408 if big else target_cfg.ffn_dim,
        n_heads=32 if big else target_cfg.n_heads, n_kv_heads=8 if big else target_cfg.n_kv_heads,
        head_dim=128, norm_eps=1e-6, rope_theta=1e7, max_positions=ctx + 64, vocab_size=target_cfg.vocab_size,
        target_layer_ids=default_target_layer_ids(target_cfg.n_layers, n_layers), block_size=16,
        mask_token_id=target_cfg.vocab_size - 250, layer_types=types, sliding_window=2048,
        causal=tuple(t == SLIDING for t in types), n_target_layers=target_cfg.n_layers)


def attach_random_drafter(eng, n_layers: int, ctx: int, mode: str, device="cuda", dtype=torch.bfloat16,
                          draft_type: str = "BF16"):
    """A random drafter of the published shape (`draft_config`), built on `device` and attached to the engine in
    `mode` (a drafter also gives the target cache its speculative rows); returns it. draft_type Q8_0 / Q6_K / Q4_K:
    the same random weights written as a GGUF drafter (`save_gguf`, a temporary file) and loaded as a user's would
    be, so its matrices run on the block kernels."""
    from dflash24.models.drafter import DFlashDrafter, load_drafter, random_state_dict, save_gguf
    cfg = draft_config(eng.model.cfg, n_layers, ctx)
    sd = random_state_dict(cfg, seed=0, dtype=dtype, device=device)
    if draft_type == "BF16":
        drafter = DFlashDrafter.from_state_dict(cfg, sd, device, dtype, ctx + 64)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, f"draft_{draft_type}.gguf")
            save_gguf(cfg, sd, path, draft_type, quant_device=device)
            drafter = load_drafter(path, device, dtype, ctx, eng.model)
    del sd
    eng.attach_drafter(drafter, mode)
    return drafter


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("gguf")
    ap.add_argument("--gpu-mem", type=float, default=None, help="emulate a card of this many GiB")
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--draft-layers", type=int, default=5)
    ap.add_argument("--pos", type=int, default=512, help="context length at which steps are timed")
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--budget", type=int, default=22, help="DDTree node budget")
    ap.add_argument("--modes", default="ar,chain,tree", help="end-to-end generation runs")
    ap.add_argument("--skip-steps", action="store_true", help="only the end-to-end runs")
    ap.add_argument("--draft-type", default="BF16", choices=("BF16", "Q8_0", "Q6_K", "Q4_K"),
                    help="the random drafter's matrices (BF16: as z-lab ships them; else a GGUF drafter)")
    args = ap.parse_args()
    rep: dict = {"file": args.gguf, "errors": {}}
    free0, total = torch.cuda.mem_get_info()
    rep["device"] = {"name": torch.cuda.get_device_name(0), "torch": torch.__version__}
    if args.gpu_mem:
        emulate_card(args.gpu_mem)
        rep["device"]["emulated_GiB"] = args.gpu_mem

    from dflash24.config import EngineConfig, SamplingParams
    from dflash24.engine import Engine

    t0 = time.perf_counter()
    eng = Engine(EngineConfig(model=args.gguf, ctx=args.ctx, device="cuda"))
    drafter = attach_random_drafter(eng, args.draft_layers, args.ctx, "chain", draft_type=args.draft_type)
    rep["draft_type"] = args.draft_type
    rep["load_s"] = round(time.perf_counter() - t0, 1)
    rep["memory_after_load_GiB"] = round(torch.cuda.memory_allocated() / GiB, 3)

    runner, draft, cache, dev = eng.runner, eng.draft_runner, eng.cache, eng.device
    vocab = eng.model.cfg.vocab_size
    B, pos = drafter.block_size, args.pos
    ids = torch.randint(0, min(vocab, 200_000), (pos,), device=dev)
    try:
        if args.skip_steps:
            raise RuntimeError("skipped (--skip-steps)")
        logits = runner.prefill(ids, 0, 512, draft.add_context)
        tok = logits.argmax(-1).view(1)
        block = torch.randint(0, min(vocab, 200_000), (B,), device=dev)
        ar = timed(lambda: runner.decode(tok, pos), args.iters)
        dr = timed(lambda: draft.draft(tok, pos), args.iters)
        vf = timed(lambda: runner.forward_fixed(block, pos, speculative=True), args.iters)
        step = runner.verify_step(B, pos)
        path = torch.arange(8, device=dev)
        cm = timed(lambda: cache.commit(step, path, pos), args.iters)
        _, step_feats = runner.forward_fixed(block, pos, speculative=True)
        rows = torch.arange(B, device=dev)
        # the decode loop's context update: the step's B feature rows in one graphed call (spec.loops)
        ac = timed(lambda: draft.add_committed(step_feats, rows, pos), args.iters)
        chain = dr + vf + cm + ac
        rep["step_ms"] = {"ar_decode": round(ar, 3), "draft": round(dr, 3), "verify16": round(vf, 3),
                          "commit": round(cm, 3), f"draft_context{B}": round(ac, 3), "chain_total": round(chain, 3),
                          "verify16_over_ar": round(vf / ar, 3), "chain_over_ar": round(chain / ar, 3),
                          "break_even_acceptance_length": round(chain / ar, 2), "at_context": pos}
    except Exception as e:  # noqa: BLE001
        rep["errors"]["steps"] = f"{type(e).__name__}: {e}"
        traceback.print_exc(file=sys.stderr)
    try:
        if args.skip_steps:
            raise RuntimeError("skipped (--skip-steps)")
        N = args.budget + 1
        tree = draft.draft_tree(tok, pos, args.budget)
        dt = timed(lambda: draft.draft_tree(tok, pos, args.budget), args.iters)
        vt = timed(lambda: runner.forward_tree(tree, pos), args.iters)
        tstep = runner.tree_commit_step(N)
        deep = int((tree.depth == min(7, int(tree.depth.max()))).nonzero()[0])   # a real root-to-node path
        tpath = tree.ancestors[deep].nonzero().flatten()
        ct = timed(lambda: cache.commit(tstep, tpath, pos), args.iters)
        _, tree_feats = runner.forward_tree(tree, pos)
        tpad = torch.cat([tpath, tpath.new_zeros(N - tpath.numel())])
        tc = timed(lambda: draft.add_committed(tree_feats, tpad, pos), args.iters)
        ar = rep.get("step_ms", {}).get("ar_decode") or timed(lambda: runner.decode(tok, pos), args.iters)
        total = dt + vt + ct + tc
        rep["tree_step_ms"] = {"budget": args.budget, "draft_and_build": round(dt, 3), f"verify{N}": round(vt, 3),
                               "commit": round(ct, 3), f"draft_context{N}": round(tc, 3), "tree_total": round(total, 3),
                               "verify_over_ar": round(vt / ar, 3), "tree_over_ar": round(total / ar, 3),
                               "break_even_acceptance_length": round(total / ar, 2)}
    except Exception as e:  # noqa: BLE001
        rep["errors"]["tree_steps"] = f"{type(e).__name__}: {e}"
        traceback.print_exc(file=sys.stderr)

    print(json.dumps(rep), flush=True)                 # the step timings, before the end-to-end runs
    for mode in args.modes.split(","):
        try:
            eng.spec_mode = mode
            prompt = torch.randint(0, min(vocab, 200_000), (pos,)).tolist()
            params = SamplingParams(max_tokens=128, ignore_eos=True)
            for _ in range(2):                     # first run captures the graphs
                events = list(eng.generate(prompt, params))
            st = events[-1].stats.as_dict()
            rep[f"generate_{mode}"] = {k: st[k] for k in ("tokens_per_s", "acceptance_length", "steps",
                                                          "draft_ms_per_step", "verify_ms_per_step",
                                                          "completion_tokens")}
        except Exception as e:  # noqa: BLE001
            rep["errors"][f"generate_{mode}"] = f"{type(e).__name__}: {e}"
            traceback.print_exc(file=sys.stderr)
            break                                      # a device-side error poisons the CUDA context
        print(json.dumps({f"generate_{mode}": rep.get(f"generate_{mode}")}), flush=True)
    if rep["errors"]:
        print(json.dumps(rep))
        return 1
    rep["memory"] = memory_report()
    print(json.dumps(rep))
    return 0


if __name__ == "__main__":
    sys.exit(main())
