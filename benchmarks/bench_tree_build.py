"""The DDTree build alone, in a CUDA graph: the PyTorch reference (spec.ddtree.reference_build_tree) against the
one-program Triton build (kernels/tree.py), and the drafter logits -> (log-prob, token) top-k before it.

    python benchmarks/bench_tree_build.py [--budgets 8,16,22,32,64] [--depth 15] [--top-k 8] [--vocab 248320]

Prints one JSON line per budget (us a build, each way; whether the two trees are equal on this input, and whether
their nodes' path scores are: bf16 logits have ties, whose order torch.topk leaves open) and one for the top-k step
(us for drafter logits of depth x vocab in bf16).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

from bench_gemv import time_graph  # noqa: E402
from dflash24.kernels import tree as tree_kernel  # noqa: E402
from dflash24.spec.ddtree import reference_build_tree  # noqa: E402


def graphed_us(fn) -> float:
    """Median us a call of fn replayed in a CUDA graph."""
    return time_graph([fn], min_ms=5, repeats=3) * 1e6


def path_scores(tokens, depth, ancestors, logp, tok) -> torch.Tensor:
    """Sorted sums of log-probs along each non-root node's path (a node's own log-prob: its token's in its depth's
    top-k row), the chain-seeded path included: equal for two trees of the same best scores."""
    d = (depth[1:] - 1).clamp(min=0)
    own = (logp[d] * (tok[d] == tokens[1:, None])).sum(-1)                        # [N-1]
    own = torch.cat([own.new_zeros(1), own])
    return torch.sort((ancestors.float() * own[None, :]).sum(-1)[1:]).values


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--budgets", default="8,16,22,32,64")
    ap.add_argument("--depth", type=int, default=15, help="drafted positions (block size - 1)")
    ap.add_argument("--top-k", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=248320)
    args = ap.parse_args()
    dev = "cuda"
    g = torch.Generator(device=dev).manual_seed(0)
    logits = (torch.randn(args.depth, args.vocab, generator=g, device=dev) * 3).to(torch.bfloat16)
    print(json.dumps({"case": "logits_topk", "depth": args.depth, "vocab": args.vocab, "top_k": args.top_k,
                      "us": round(graphed_us(lambda: torch.topk(logits.float().log_softmax(-1), args.top_k, -1)),
                                  2)}), flush=True)
    logp, tok = torch.topk(logits.float().log_softmax(-1), args.top_k, -1)
    root = torch.tensor([7], device=dev)
    for b in (int(v) for v in args.budgets.split(",")):
        ref = reference_build_tree(root, logp, tok, b)
        got = tree_kernel.build_tree(root, logp, tok, b)
        same = all(torch.equal(x, y) for x, y in zip(got, (ref.tokens, ref.parents, ref.depth, ref.ancestors)))
        same_scores = torch.allclose(path_scores(got[0], got[2], got[3], logp, tok),
                                     path_scores(ref.tokens, ref.depth, ref.ancestors, logp, tok), atol=1e-3)
        print(json.dumps({"case": "build", "budget": b, "depth": args.depth, "top_k": args.top_k,
                          "reference_us": round(graphed_us(lambda: reference_build_tree(root, logp, tok, b)), 2),
                          "fused_us": round(graphed_us(lambda: tree_kernel.build_tree(root, logp, tok, b)), 2),
                          "equal_trees": same, "equal_path_scores": same_scores}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
