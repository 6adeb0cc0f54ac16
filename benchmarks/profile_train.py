"""Where a drafter-training step's time goes: a few steps of `Trainer` on cached generated data, under the torch
profiler (top ops by device time) and as wall time per sequence.

    python benchmarks/profile_train.py TARGET.gguf DATA_DIR [--steps 6] [--batch-size 8] [--max-len 768]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from dflash24.train.data import load_cache  # noqa: E402
from dflash24.train.trainer import TrainConfig, Trainer  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("data_dir")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--max-len", type=int, default=768)
    ap.add_argument("--anchors", type=int, default=256)
    a = ap.parse_args()
    _, seqs = load_cache(a.data_dir)
    tc = TrainConfig(model=a.model, out="/tmp/profile_train", layers=3, ffn_dim=2432, batch_size=a.batch_size,
                     anchors=a.anchors, max_len=a.max_len, steps=1000, progress=False, save_every=10**9)
    tr = Trainer(tc, seqs[:400])
    for _ in range(3):
        tr.train_step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(a.steps):
        tr.train_step()
    torch.cuda.synchronize()
    dt = (time.perf_counter() - t0) / a.steps
    print(f"wall {dt * 1000:.1f} ms per step, {dt * 1000 / a.batch_size:.1f} ms per sequence", flush=True)
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(2):
            tr.train_step()
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=30, max_name_column_width=60))
    print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=15, max_name_column_width=60))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
