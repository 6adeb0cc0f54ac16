"""Run a benchmark script with module attributes of the package set first (launch-policy experiments in one call).

    python benchmarks/with_settings.py 'K.XPERM_TYPES={QT.Q5_K,QT.Q6_K}; K.PAIRS_FROM_TOKENS=17' benchmarks/bench_spec.py ARGS...

The statements run with K = dflash24.quant.kernels, N = dflash24.kernels.norm, L = dflash24.models.layers,
DN = dflash24.kernels.deltanet, R = dflash24.runner and QT (gguf's quantization types) in scope; then the script
runs as __main__ with ARGS.
"""
import runpy
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from gguf import GGMLQuantizationType as QT  # noqa: E402

import dflash24.kernels.deltanet as DN  # noqa: E402
import dflash24.kernels.norm as N  # noqa: E402
import dflash24.models.layers as L  # noqa: E402
import dflash24.quant.kernels as K  # noqa: E402
import dflash24.runner as R  # noqa: E402

settings, script, *args = sys.argv[1:]
exec(settings, {"K": K, "N": N, "L": L, "DN": DN, "R": R, "QT": QT})
print(f"settings: {settings}", file=sys.stderr)
sys.argv = [script, *args]
sys.path.insert(0, str(Path(script).resolve().parent))
runpy.run_path(script, run_name="__main__")
