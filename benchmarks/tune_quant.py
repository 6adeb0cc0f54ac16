"""Config sweep of the quant kernels on a GPU (developer tool): GEMV tiles, dot tiles, large-M path."""
from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from gguf import GGMLQuantizationType as QT  # noqa: E402

from bench_gemv import copy_bandwidth, packed_copies, time_graph  # noqa: E402
from dflash24.quant import kernels as K  # noqa: E402
from dflash24.quant.formats import random_raw  # noqa: E402
from dflash24.quant.packed import GEOMETRY, pack  # noqa: E402


def main():
    torch.backends.cuda.matmul.allow_tf32 = False
    t0 = time.time()
    bw = copy_bandwidth(1 << 30)
    print(f"copy {bw / 1e9:.0f} GB/s", flush=True)
    sms = K._sms(torch.device("cuda"))
    from bench_gemv import check
    for q in (QT.Q4_K, QT.Q6_K, QT.Q5_0, QT.Q8_0):
        print("check", q.name, {k: f"{v:.1e}" for k, v in check(q, 1024, 2048).items()}, flush=True)
    types = [QT.Q4_K, QT.Q6_K, QT.Q5_0, QT.Q8_0]
    shapes = [(17408, 5120), (5120, 17408)]
    for n, k in shapes:
        for q in types:
            copies = packed_copies(q, n, k)
            nbytes = copies[0].nbytes
            bs, _ = GEOMETRY[q]
            nblk = k // bs
            x1 = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
            res = []
            g0 = K._GEMV_TILE[q][1]
            for bn, g, w, st in [(4, g0, 1, 3), (8, g0, 1, 2), (4, g0, 1, 4), (8, g0, 1, 3)]:
                for waves in (0, 4):
                    n_prog = -(-n // bn)
                    split, per = K._split(n_prog, nblk, g, sms, waves=waves, min_steps=2) if waves else (1, -(-nblk // g) * g)
                    if waves and split == 1:
                        continue
                    cfg = dict(BLOCK_N=bn, G=g, num_warps=w, split=split, per=per, stages=st)
                    try:
                        t = time_graph([lambda p=p, c=cfg: K.gemv(x1, p, c) for p in copies], min_ms=5, repeats=3)
                        res.append((nbytes / t / bw * 100, f"bn{bn} st{st} s{split}", t))
                    except Exception as e:
                        print("fail", cfg, type(e).__name__, str(e)[:200], flush=True)
            res.sort(reverse=True)
            best_t = res[0][2]
            line = f"{q.name} {n}x{k} {nbytes/1e6:.1f}MB | " + " ".join(f"{nm}:{pc:.1f}%" for pc, nm, _ in res)
            print(line, flush=True)
            # dot path: M = 1, 16, 23, 64 with the default config and BN 32 / 128
            for bn, w in [(64, 4), (32, 4)]:
                out = []
                for m in (1, 16, 23, 64):
                    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
                    cfg = K.dot_config(copies[0], m, x.device)
                    cfg["BLOCK_N"] = bn
                    cfg["num_warps"] = w
                    n_prog = -(-n // bn)
                    cfg["split"], cfg["per"] = K._split(n_prog, nblk, cfg["G"], sms, waves=K._DOT_TILE.get(q, K._DOT_DEFAULT)[1], min_steps=2)
                    try:
                        t = time_graph([lambda p=p, c=cfg, x=x: K._matmul_dot(x, p, c, torch.float32, None) for p in copies], min_ms=5, repeats=3)
                        out.append(f"M{m}:{t*1e6:.1f}us={t / best_t:.2f}x")
                    except Exception as e:
                        out.append(f"M{m}:fail {type(e).__name__} {str(e)[:100]}")
                print(f"   dot bn{bn} w{w} s{cfg['split']} (best gemv {best_t*1e6:.1f}us): " + " ".join(out), flush=True)
            for m in ():
                if q != QT.Q4_K and m == 4096:
                    continue
                x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
                t = time_graph([lambda p=p, x=x: K.matmul(x, p) for p in copies[:2]], min_ms=5, repeats=3)
                print(f"   large M{m}: {2*m*n*k/t/1e12:.1f} TF", flush=True)
            del copies
            torch.cuda.empty_cache()
            print(f"   ({time.time()-t0:.0f}s)", flush=True)


if __name__ == "__main__":
    main()
