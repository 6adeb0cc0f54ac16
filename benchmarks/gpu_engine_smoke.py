"""GPU smoke + parity: the engine on CUDA (Triton block kernels, CUDA graphs) in every decoding mode, against
itself in AR mode and against the CPU reference engine on the same GGUF. Prints one JSON line per model.

    python benchmarks/gpu_engine_smoke.py [FILE.gguf ...]   (default: tiny random qwen2 + qwen35 written here)
"""
from __future__ import annotations

import json
import sys
import tempfile
import time

import torch

sys.path.insert(0, "tests")


def generate(eng, ids, n):
    from dflash24.config import SamplingParams
    out, final = [], None
    for ev in eng.generate(ids, SamplingParams(max_tokens=n, ignore_eos=True)):
        out += ev.token_ids
        final = ev
    return out, final.stats.as_dict()


def check(path: str, draft_dir: str, n: int = 96) -> dict:
    from dflash24.config import EngineConfig
    from dflash24.engine import Engine
    rep: dict = {"model": path}
    t = time.time()
    cpu = Engine(EngineConfig(model=path, device="cpu", ctx=512))
    ids = cpu.encode_raw("def quicksort(arr):\n")
    ref, _ = generate(cpu, ids, n)
    gpu_ar = None
    for mode, graphs, budget in (("ar", True, 22), ("ar", False, 22), ("chain", True, 22), ("tree", True, 22),
                                 ("tree", True, 64)):        # budget 64: verify matmuls of 65 rows, in 3 launches
        eng = Engine(EngineConfig(model=path, device="cuda", ctx=512, spec=mode, cuda_graphs=graphs,
                                  draft=None if mode == "ar" else draft_dir, ddtree_budget=budget))
        generate(eng, ids, n)                      # first run captures graphs / compiles kernels
        out, st = generate(eng, ids, n)
        gpu_ar = gpu_ar or out
        diff = lambda a_, b_: next((i for i, (a, b) in enumerate(zip(a_, b_)) if a != b), None)  # noqa: E731
        rep[f"{mode}{'' if graphs else '_eager'}{'' if budget == 22 else f'_budget{budget}'}"] = {
            "first_diff_vs_cpu": diff(out, ref), "first_diff_vs_gpu_ar": diff(out, gpu_ar),
            "tokens_per_s": st["tokens_per_s"],
            "acceptance_length": st["acceptance_length"]}
    rep["wall_s"] = round(time.time() - t, 1)
    return rep


def main():
    from dflash24.gguf.reader import GGUFFile
    from dflash24.models import load_target
    from dflash24.models.drafter import make_random_drafter_dir
    paths = sys.argv[1:]
    tmp = tempfile.mkdtemp()
    if not paths:
        from conftest import write_tiny_qwen2_gguf
        from dflash24.synth import write_preset
        paths = [str(write_tiny_qwen2_gguf(tmp + "/tiny.gguf", n_layers=4, dim=256, ffn_dim=1024, qtype="Q8_0")),
                 write_preset("qwen35-tiny", tmp + "/q35.gguf", seed=3)]
    for p in paths:
        cfg = load_target(GGUFFile(p), "cpu", torch.float32, 64).cfg
        d = make_random_drafter_dir(f"{tmp}/draft-{len(p)}", cfg, 2, dtype=torch.bfloat16,
                                    target_layer_ids=(0, cfg.n_layers // 2))
        try:
            print(json.dumps(check(p, str(d))), flush=True)
        except Exception as e:  # noqa: BLE001 - report and go on to the next model
            import traceback
            traceback.print_exc()
            print(json.dumps({"model": p, "error": f"{type(e).__name__}: {e}"}), flush=True)


if __name__ == "__main__":
    main()
