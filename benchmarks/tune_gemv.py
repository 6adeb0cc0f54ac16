"""Block-matmul sweep on a CUDA GPU at the 27B shapes: the int8-activation (dp4a) GEMV over launch configs as a
fraction of the copy bandwidth measured in the same run, and the small-M verify path at M = 16 and 23 as ratios to
that GEMV (the tl.dot kernel's launch-config sweep: tune_dot.py; the Gluon kernel's: bench_gluon_matmul.py).

    python benchmarks/tune_gemv.py [--types Q4_K,Q6_K,Q5_0,Q8_0] [--min-ms 20] [--configs JSON] [--no-small-m]
                                   [--markdown]

Prints one JSON line per (type, shape): us and fraction of copy bandwidth per kernel/config, the time of
quantize_x alone, the int8 GEMV's error against the quantized-activation reference (exactness), and
small_m: {M: {"engine": [us, / GEMV], "dot": [us, / GEMV]}}. "engine" is the call a verify step makes
(`kernels.quant_matmul`, bf16 out, with x in the kernels' K orders as the norms hand it over: the Gluon kernel for
Q8_0 / Q4_0 / Q5_0 / Q4_K / Q5_K / Q6_K where K % 256 == 0, the tl.dot kernel otherwise), "dot" the tl.dot kernel
on x in natural order.
--markdown: at the end, issue #2's table made from those lines (`markdown`).
--configs: a JSON list of [BLOCK_N, G, num_warps, stages] or
[BLOCK_N, G, num_warps, stages, row_run(, row_pair(, unroll(, prefetch(, maxnreg(, whole(, split))))))]
(G in 32-weight blocks: doubled for Q6_K) instead of CONFIGS ('[]': the shipped config only); stages 1 is a plain
loop (no cp.async copies, no shared memory), whose latency only other programs on the SM hide; row_pair (BLOCK_N 2)
runs the two rows as one-row tiles sharing x; unroll: the loop's unroll factor; prefetch (row pairs on a plain
loop): the next step's tiles loaded into registers before this step's sums (2: the next two steps', whole steps
only); maxnreg: a register cap (ptxas .maxnreg; 0 none); whole: the row pairs' loads unmasked where every step is
whole (default: kernels.GEMV_WHOLE there); split: K split this many ways (0: the heuristic; the partial sums'
launch is part of the time)."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gguf import GGMLQuantizationType as QT  # noqa: E402

from bench_gemv import copy_bandwidth, packed_copies, time_graph  # noqa: E402
from dflash24.quant import kernels  # noqa: E402
from dflash24.quant.formats import random_raw  # noqa: E402
from dflash24.quant.packed import pack  # noqa: E402

SHAPES = [(17408, 5120), (5120, 17408), (12288, 5120), (248320, 5120)]
# (BLOCK_N, G, num_warps, stages); G counts scale blocks (16 weights for Q6_K, so G doubles there)
CONFIGS = [(4, 32, 1, 3), (8, 16, 1, 3), (8, 32, 2, 3), (16, 16, 2, 3), (16, 32, 4, 3), (32, 16, 4, 3),
           (4, 16, 1, 4), (16, 8, 1, 3), (32, 8, 2, 3)]


def exactness(qtype, n: int, k: int) -> float:
    raw = random_raw(qtype, n, k, d_scale=0.01, device="cuda")
    p = pack(raw, qtype, k)
    x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
    q, dx = kernels.reference_quantize_x(x)
    xq = (q.float().reshape(-1, 32) * dx[:, None]).reshape(1, -1)
    ref = kernels.reference_matmul(xq, raw, qtype, k)
    y = kernels.gemv(x, p)
    return float((y - ref).abs().max() / ref.abs().max())


def markdown(head: dict, rows: list[dict]) -> str:
    """Issue #2's table from the printed lines (head: the copy-bandwidth line): per type and shape, the shipped
    GEMV's us and fraction of the copy bandwidth, then the engine's small-M path at M = 16 / 23 as multiples of it
    (the tl.dot kernel's in brackets where it is another kernel)."""
    shapes = list(dict.fromkeys((r["N"], r["K"]) for r in rows))
    out = [f"Copy bandwidth {head['copy_GBps']:,.1f} GB/s ({head['device']}). GEMV (M = 1) us and fraction of the "
           "copy bandwidth; M = 16 / 23 on the engine's path as multiples of that GEMV (the tl.dot kernel's in "
           "brackets where it differs):", "",
           "| type | " + " | ".join(f"{n}x{k}" for n, k in shapes) + " |", "|---" * (len(shapes) + 1) + "|"]
    for qtype in dict.fromkeys(r["qtype"] for r in rows):
        cells = []
        for n, k in shapes:
            r = next((r for r in rows if r["qtype"] == qtype and (r["N"], r["K"]) == (n, k)), None)
            if r is None or "default" not in r:
                cells.append(r["error"][:60] if r and "error" in r else "-")
                continue
            us, frac = r["default"]
            cell = f"{us:.2f} us, {100 * frac:.1f} %"
            small = r.get("small_m") or {}
            if small:
                eng = " / ".join(f"{v['engine'][1]:.2f}x" for v in small.values())
                dot = " / ".join(f"{v['dot'][1]:.2f}x" for v in small.values())
                cell += f"; {eng}" + (f" ({dot})" if dot != eng else "")
            cells.append(cell)
        out.append(f"| {qtype} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--types", default="Q4_K,Q6_K,Q5_0,Q8_0")
    ap.add_argument("--shapes", default="")
    ap.add_argument("--min-ms", type=float, default=20.0)
    ap.add_argument("--configs", default="",
                    help="JSON list of [BLOCK_N, G, num_warps, stages(, row_run(, row_pair(, unroll(, prefetch(, "
                         "maxnreg(, whole(, split)))))))]")
    ap.add_argument("--no-small-m", action="store_true", help="skip the M = 16 / 23 timings")
    ap.add_argument("--markdown", action="store_true", help="end with issue #2's table of the lines printed")
    args = ap.parse_args()
    bw = copy_bandwidth(2 << 30)
    head = {"copy_GBps": round(bw / 1e9, 1), "device": torch.cuda.get_device_name()}
    print(json.dumps(head), flush=True)
    rows = []
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",") if s] or SHAPES
    for name in args.types.split(","):
        qtype = QT[name]
        for n, k in shapes:
            row = {"qtype": name, "N": n, "K": k}
            try:
                row["int8_rel_err_vs_quantized_x_ref"] = exactness(qtype, min(n, 4096), k)
                copies = packed_copies(qtype, n, k)
                nb = copies[0].nbytes
                x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
                t = time_graph([lambda p=p: kernels.gemv(x, p) for p in copies], min_ms=args.min_ms)
                row["default"] = [round(t * 1e6, 2), round(nb / t / bw, 3)]
                t1 = t
                row["small_m"] = {}
                for m in () if args.no_small_m else (16, 23):
                    xm = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
                    pairs = kernels.PairRows.of(xm)       # x in the kernels' K orders, as the norms write it
                    ts = time_graph([lambda p=p: kernels.quant_matmul(xm, p, pairs=pairs) for p in copies],
                                    min_ms=args.min_ms)
                    tb = time_graph([lambda p=p: kernels._matmul_dot(xm, p, None, torch.bfloat16, None)
                                     for p in copies], min_ms=args.min_ms)
                    row["small_m"][m] = {"engine": [round(ts * 1e6, 2), round(ts / t1, 2)],
                                         "dot": [round(tb * 1e6, 2), round(tb / t1, 2)]}
                t = time_graph([lambda: kernels.quantize_x(x.reshape(-1), qtype)], min_ms=args.min_ms)
                row["quantize_x_us"] = round(t * 1e6, 2)
                base = kernels.gemv_config(copies[0], x.device)
                for bn, g, w, st, *flags in json.loads(args.configs) if args.configs else CONFIGS:
                    if qtype == QT.Q6_K:
                        g *= 2
                    cfg = dict(base, BLOCK_N=bn, G=g, num_warps=w, stages=st, row_pair=False)
                    if flags:
                        cfg["row_run"] = bool(flags[0])
                    if len(flags) > 1:
                        cfg["row_pair"] = bool(flags[1])
                    if len(flags) > 2:
                        cfg["unroll"] = int(flags[2])
                    cfg["prefetch"] = int(flags[3]) if len(flags) > 3 else 0         # steps ahead
                    cfg["maxnreg"] = int(flags[4]) if len(flags) > 4 else 0
                    nblk = k // kernels.GEOMETRY[qtype][0]
                    cfg["split"], cfg["per"] = kernels._split(-(-n // bn), nblk, g, kernels._sms(x.device),
                                                              waves=kernels._GEMV_WAVES, min_steps=2)
                    if len(flags) > 6 and int(flags[6]) > 0:
                        steps = -(-nblk // g)
                        cfg["per"] = -(-steps // int(flags[6])) * g
                        cfg["split"] = -(-nblk // cfg["per"])
                    cfg["whole"] = (cfg["row_pair"] and kernels._whole_steps(nblk, cfg["per"], g)
                                    and (bool(flags[5]) if len(flags) > 5 else kernels.GEMV_WHOLE))
                    key = (f"int8_{bn}x{g}w{w}s{st}{'r' if cfg['row_run'] else ''}{'p' if cfg['row_pair'] else ''}"
                           f"{'u%d' % cfg['unroll'] if cfg.get('unroll', 1) > 1 else ''}"
                           f"{'f' * cfg['prefetch']}{'m%d' % cfg['maxnreg'] if cfg['maxnreg'] else ''}"
                           f"{'W' if cfg['whole'] else ''}"
                           f"{'k%d' % cfg['split'] if cfg['split'] > 1 else ''}")
                    try:
                        t = time_graph([lambda p=p: kernels.gemv(x, p, cfg) for p in copies], min_ms=args.min_ms)
                        row[key] = [round(t * 1e6, 2), round(nb / t / bw, 3), cfg["split"]]   # us, of copy, split
                    except Exception as e:  # noqa: BLE001
                        row[key] = f"{type(e).__name__}: {str(e)[:120]}"
                del copies
                torch.cuda.empty_cache()
            except Exception as e:  # noqa: BLE001
                row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
            print(json.dumps(row), flush=True)
            rows.append(row)
    if args.markdown:
        print(markdown(head, rows), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
