"""GPU smoke + parity: the engine on CUDA (Triton block kernels, CUDA-graph decode) against the CPU
reference engine on the same GGUF. Prints JSON: tokens equal?, tok/s.

    python benchmarks/gpu_engine_smoke.py [FILE.gguf ...]   (default: a tiny random qwen2 written here)
"""
from __future__ import annotations

import json
import sys
import tempfile
import time

import torch

sys.path.insert(0, "tests")


def run(path: str, device: str, n: int, prompt_ids=None, **kw):
    from dflash24.config import EngineConfig, SamplingParams
    from dflash24.engine import Engine
    eng = Engine(EngineConfig(model=path, device=device, ctx=kw.get("ctx", 1024), **{k: v for k, v in kw.items() if k != "ctx"}))
    ids = prompt_ids or eng.encode_raw("def quicksort(arr):\n")
    out, final = [], None
    for ev in eng.generate(ids, SamplingParams(max_tokens=n, ignore_eos=True)):
        out += ev.token_ids
        final = ev
    return out, final.stats.as_dict(), ids


def main():
    paths = sys.argv[1:]
    if not paths:
        from conftest import write_tiny_qwen2_gguf
        paths = [write_tiny_qwen2_gguf(tempfile.mkdtemp() + "/tiny.gguf", n_layers=4, dim=256, ffn_dim=1024,
                                       qtype="Q8_0")]
    report = []
    for p in paths:
        t = time.time()
        gpu_tokens, gpu_stats, ids = run(str(p), "cuda", 128)
        gpu_tokens2, gpu_stats2, _ = run(str(p), "cuda", 128, ids, cuda_graphs=False)
        cpu_tokens, _, _ = run(str(p), "cpu", 32, ids)
        first_diff = next((i for i, (a, b) in enumerate(zip(gpu_tokens, cpu_tokens)) if a != b), None)
        report.append({"model": str(p), "graph_equals_eager": gpu_tokens == gpu_tokens2,
                       "gpu_vs_cpu_first_diff": first_diff, "gpu_stats": gpu_stats,
                       "eager_tokens_per_s": gpu_stats2["tokens_per_s"], "wall_s": round(time.time() - t, 1)})
        print(json.dumps(report[-1]), flush=True)


if __name__ == "__main__":
    main()
