"""The DeltaNet part of a speculative step on a GPU: the speculative-step kernel (`spec_chunk_triton`, matrix
products over the step's tokens) against the recurrent kernel (`recurrent_triton`, token after token; a tree keeps
every node's state), one layer at the 27B shape.

    python benchmarks/bench_spec_delta.py [--tokens 1,16,23,32] [--heads 48 --key-heads 16 --dim 128]
                                          [--precision S,T] [--tile BV,WARPS] [--kc N] [--two-loops 0|1]

Chains of T tokens and trees of T nodes (a DDTree-like shape: a main chain with side branches), each as the verify
step runs it (inputs recorded for the commit). Time per call: median of CUDA-graph replays. Error: max |chunk -
recurrent| over the outputs, relative to max |recurrent|. One JSON line per case.
"""
from __future__ import annotations

import argparse
import functools
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_gemv import time_graph

from dflash24.kernels import deltanet as dn
from dflash24.spec.ddtree import ancestor_mask


def ddtree_like(T: int, gen: torch.Generator) -> torch.Tensor:
    """Parents of T nodes: node t continues node t - 1 with probability 0.6, else an earlier node (or the root)."""
    parents = [-1]
    for t in range(1, T):
        parents.append(t - 1 if torch.rand(1, generator=gen).item() < 0.6
                       else int(torch.randint(-1, t - 1, (1,), generator=gen)))
    return torch.tensor(parents)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", default="1,16,23,32")
    ap.add_argument("--heads", type=int, default=48)
    ap.add_argument("--key-heads", type=int, default=16)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--precision", default=",".join(dn.SPEC_CHUNK_PRECISION),
                    help="STATE,TOKENS input precisions (tf32x3 | tf32 | ieee each)")
    ap.add_argument("--tile", default="", help="BV,WARPS (default: SPEC_CHUNK_TILE)")
    ap.add_argument("--kc", type=int, default=dn.SPEC_CHUNK_KC, help="Dk columns per product step")
    ap.add_argument("--two-loops", type=int, default=int(dn.SPEC_CHUNK_TWO_LOOPS),
                    help="1: the state products and those among the tokens in two loops (SPEC_CHUNK_TWO_LOOPS)")
    args = ap.parse_args()
    dev, hv, hk, d = "cuda", args.heads, args.key_heads, args.dim
    dn.SPEC_CHUNK_PRECISION = tuple(args.precision.split(","))
    dn.SPEC_CHUNK_KC = args.kc
    dn.SPEC_CHUNK_TWO_LOOPS = bool(args.two_loops)
    if args.tile:
        dn.SPEC_CHUNK_TILE = tuple(int(x) for x in args.tile.split(","))
    gen = torch.Generator().manual_seed(0)
    for T in (int(t) for t in args.tokens.split(",")):
        q = dn.l2norm(torch.randn(T, hk, d, generator=gen)).to(dev) * d ** -0.5
        k = dn.l2norm(torch.randn(T, hk, d, generator=gen)).to(dev)
        v = torch.randn(T, hv, d, generator=gen).to(dev)
        g = (-torch.nn.functional.softplus(torch.randn(T, hv, generator=gen)) * 0.5).to(dev)
        beta = torch.rand(T, hv, generator=gen).to(dev)
        state = (torch.randn(hv, d, d, generator=gen) * 0.1).to(dev)
        record = [torch.empty(T, hk, d, device=dev), torch.empty(T, hv, d, device=dev),
                  torch.empty(T, hv, device=dev), torch.empty(T, hv, device=dev)]
        states = torch.empty(T, hv, d, d, device=dev)
        for tree in (False, True):
            parents = ddtree_like(T, gen) if tree else None
            anc = ancestor_mask(parents, T).to(dev) if tree else None
            par = parents.to(dev) if tree else None
            out_c = torch.empty(T, hv, d, device=dev)
            chunk = functools.partial(dn.spec_chunk_triton, q, k, v, g, beta, state, ancestors=anc, out=out_c,
                                      record=record)
            recurrent = functools.partial(dn.recurrent_triton, q, k, v, g, beta, state, parents=par,
                                          states=states if tree else None, update_state=False, record=record)
            ref = recurrent()
            chunk()
            torch.cuda.synchronize()
            err = ((out_c - ref).abs().max() / ref.abs().max()).item()
            t_c, t_r = time_graph([chunk]), time_graph([recurrent])
            print(json.dumps({"T": T, "tree": tree, "precision": args.precision, "tile": args.tile, "kc": args.kc,
                              "two_loops": args.two_loops,
                              "chunk_us": round(t_c * 1e6, 2), "recurrent_us": round(t_r * 1e6, 2),
                              "ratio": round(t_c / t_r, 3),
                              "rel_err": float(f"{err:.3g}")}), flush=True)


if __name__ == "__main__":
    main()
