"""The Gluon small-M block matmul (`quant/gluon_matmul.py`) against the tl.dot kernel, on a GPU.

    python benchmarks/bench_gluon_matmul.py [--type Q4_K|Q5_K|Q6_K|Q8_0|Q4_0|Q5_0] [--m 16,23]
                                            [--shapes 17408x5120,...] [--tiles 64x4,128x2,...] [--max-rows 64]

Per shape and M: max error of each against `reference_matmul` (relative to max |y|; also per tile) and of one
against the other; then CUDA-graph medians over enough weight copies to defeat L2, us: the M = 1 GEMV, the tl.dot
kernel (x in pair order, made outside the timing as the norms make it), and the Gluon kernel at each tile (x in
gluon order, also made outside), each with its split-K sum. One JSON line per (shape, M). A tile is BLOCK_N x waves,
or T: the table's BLOCK_N and waves for the shape (`gluon_matmul.config`); then "a" turns ACC2 on (two accumulator
chains a step), none off, whatever the table says; then "o" decodes as before gluon_matmul.DENORM (two bf16x2 ops
a weight pair), "s" as gluon_matmul.DENORM (one), whatever DENORM_TILES says; then "w" runs Hopper's warpgroup MMA
(`WG`; T then means gluon_matmul.WG_TILE's BLOCK_N and waves), none mma.sync, whatever WG_TILES says; then "rN"
caps registers at N a thread (triton's maxnreg; none: the table's cap for the shape, gluon_matmul.NREG, or
WG_NREG, when BLOCK_N is the table's).
Example: 64x3ar96. --max-rows 64: `gluon_matmul.MAX_ROWS` for the run, so that 33..64 rows take one 64-row tile;
rows past 32 are then also timed as the launches of up to 32 rows that MAX_ROWS 32 makes (`chunks32_us`).
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from gguf import GGMLQuantizationType as QT  # noqa: E402

from bench_gemv import packed_copies, time_graph  # noqa: E402
from dflash24.quant import gluon_matmul as G  # noqa: E402
from dflash24.quant import kernels as K  # noqa: E402
from dflash24.quant.packed import pack  # noqa: E402
from dflash24.quant.formats import random_raw  # noqa: E402


DEFAULT_SHAPES = {QT.Q4_K: "34816x5120,5120x17408,13312x5120,14336x5120,6240x5120,5120x6144",
                  QT.Q5_K: "10240x5120",                        # the DeltaNet in_proj (attn_qkv)
                  QT.Q6_K: "5120x17408,1024x5120,248320x5120",  # ffn_down of a third of the layers, attn_v, output
                  QT.Q8_0: "17408x5120,5120x17408,12288x5120,248320x5120",   # issue #2's shapes
                  QT.Q4_0: "17408x5120,5120x17408,12288x5120,248320x5120",
                  QT.Q5_0: "17408x5120,5120x17408,12288x5120,248320x5120"}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--m", default="16,23")
    ap.add_argument("--type", default="Q4_K", choices=[t.name for t in G.TYPES])
    ap.add_argument("--shapes", default="", help="default: the 27B's matmuls of the type as FusedLinear stacks them")
    ap.add_argument("--tiles", default="64x2,64x3,64x4,64x6,64x8,128x2,128x3,128x4")
    ap.add_argument("--min-ms", type=float, default=3.0)
    ap.add_argument("--max-rows", type=int, default=G.MAX_ROWS, help="gluon_matmul.MAX_ROWS for the run (32 or 64)")
    ap.add_argument("--past", default="", help="also each of these gluon_matmul.X_PAST_M modes (how a tile's rows past "
                    "M are read: 0 row M - 1 again, 1 zeros, 2 row t %% M), comma-separated; keys gluon_TILE_pP")
    args = ap.parse_args()
    G.MAX_ROWS = args.max_rows
    dev = torch.device("cuda")
    q = QT[args.type]
    shapes = args.shapes or DEFAULT_SHAPES[q]
    tiles = args.tiles.split(",")
    for shape in shapes.split(","):
        n, k = (int(v) for v in shape.split("x"))
        copies = packed_copies(q, n, k)
        raw = random_raw(q, n, k, d_scale=0.01, device="cuda")
        p0 = pack(raw, q, k)
        for m in (int(v) for v in args.m.split(",")):
            x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
            x1 = x[:1].contiguous()
            xp = K.pair_order(x, q).contiguous() if q in K.XPERM_TYPES else None     # Q8_0: natural order
            xg = G.gluon_order(x, q).contiguous()
            ref = K.reference_matmul(x, raw, q, k)
            scale = float(ref.abs().max())
            y_dot = K._matmul_dot(x, p0, K.dot_config(p0, m, dev), torch.float32, None, x_pairs=xp)
            y_gl = G.matmul(x, p0, x_order=xg)
            row = {"N": n, "K": k, "M": m,
                   "err_dot": round(float((y_dot - ref).abs().max()) / scale, 6),
                   "err_gluon": round(float((y_gl - ref).abs().max()) / scale, 6),
                   "gluon_vs_dot": round(float((y_gl - y_dot).abs().max()) / scale, 6)}
            t1 = time_graph([lambda p=p: K.gemv(x1, p) for p in copies], min_ms=args.min_ms, repeats=3)
            cfg = K.dot_config(copies[0], m, dev)
            t_dot = time_graph([lambda p=p: K._matmul_dot(x, p, cfg, torch.float32, None, x_pairs=xp)
                                for p in copies], min_ms=args.min_ms, repeats=3)
            row.update(gemv_us=round(t1 * 1e6, 2), dot_us=round(t_dot * 1e6, 2), dot_over_gemv=round(t_dot / t1, 2))
            if m > 32:      # as kernels.matmul launches them with MAX_ROWS 32: near-equal chunks of up to 32 rows
                G.MAX_ROWS = 32
                t_ch = time_graph([lambda p=p: K._gluon_rows(x, p, torch.float32, None, xg) for p in copies],
                                  min_ms=args.min_ms, repeats=3)
                err_ch = float((K._gluon_rows(x, p0, torch.float32, None, xg) - ref).abs().max()) / scale
                G.MAX_ROWS = args.max_rows
                row.update(chunks32_us=round(t_ch * 1e6, 2), err_chunks32=round(err_ch, 6))
            shipped_past = G.X_PAST_M
            for tile, past in [(t, None) for t in tiles] + [(t, int(v)) for v in filter(None, args.past.split(","))
                                                              for t in tiles]:
                G.X_PAST_M = shipped_past if past is None else past
                key = f"gluon_{tile}" + ("" if past is None else f"_p{past}")
                tm = re.fullmatch(r"(T|(\d+)x(\d+))(a?)([os]?)(w?)(?:r(\d+))?", tile)
                if tm is None:
                    raise SystemExit(f"bad tile {tile!r}: BNxWAVES or T, then a, o or s, w, rN (e.g. 64x3ar96)")
                bn, waves = (int(v) if v else None for v in (tm[2], tm[3]))
                c = dict(G.config(copies[0], m, dev, block_n=bn, waves=waves, wg=tm[6] == "w"), acc2=tm[4] == "a")
                if tm[5]:
                    c["denorm"] = tm[5] == "s"
                if tm[7]:
                    c["nreg"] = int(tm[7])
                try:
                    err = float((G.matmul(x, p0, c, x_order=xg) - ref).abs().max()) / scale
                    t = time_graph([lambda p=p: G.matmul(x, p, c, x_order=xg) for p in copies], min_ms=args.min_ms,
                                   repeats=3)
                except Exception as e:  # noqa: BLE001 - a tile the compiler or the SM cannot take
                    row[key] = f"failed: {str(e)[:160]}"
                    continue
                row[key] = {"us": round(t * 1e6, 2), "tile": [c["BLOCK_N"], c["split"]],
                                              "over_dot": round(t / t_dot, 3), "over_gemv": round(t / t1, 2),
                                              "err": round(err, 6)}
            G.X_PAST_M = shipped_past
            print(json.dumps(row), flush=True)
        del copies
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
