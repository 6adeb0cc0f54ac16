"""A driver for Nsight Compute: the shipped decode GEMV (M = 1) and small-M dot kernel (M = 16) on one random
weight of the 27B's 17408x5120 shape per type, three calls each, so ncu can skip the compiling calls.

    ncu --clock-control none -k regex:"_dot_kernel|_gemv_int8_kernel" --launch-skip 4 --launch-count 2 \\
        --section WarpStateStats --section SourceCounters ... python3 benchmarks/ncu_matmul.py Q4_K [--xperm]

--xperm: the dot kernel reads x in pair order, as a verify step hands it (`kernels.pair_order`).
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from gguf import GGMLQuantizationType as QT  # noqa: E402

from bench_gemv import packed_copies  # noqa: E402
from dflash24.quant import kernels as K  # noqa: E402


def main() -> int:
    dev = torch.device("cuda")
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    xperm = "--xperm" in sys.argv
    for name in (args[0] if args else "Q4_K").split(","):
        p = packed_copies(QT[name], 17408, 5120)[0]
        x = torch.randn(16, 5120, device=dev, dtype=torch.bfloat16)
        x_pairs = K.pair_order(x, QT[name]) if xperm else None
        for _ in range(3):
            K.gemv(x[:1], p)
            K._matmul_dot(x, p, None, torch.float32, None, x_pairs=x_pairs)
        torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
