"""DDTree (arXiv 2604.12989): verify a tree of the drafter's most likely continuations in one target forward.

Everything here is fixed-shape tensor work on the device (no host sync, CUDA-graph capturable):

build_tree: the drafter gives, for each of the D = B-1 block positions, its top-K tokens and log-probs.
    A node is a rank tuple (r_1..r_d); its score is sum_j logp[j, r_j]. Best-first expansion with a heap
    (pop a node, push its next sibling and first child) selects the `budget` highest-scoring nodes; because
    scores only fall along a path, that set is prefix-closed and equals: the best `budget` nodes of each
    depth (a beam) -> the best `budget` of their union. Ties are broken towards shallower nodes by a tiny
    per-depth penalty so a child never outranks its parent. The chain seed forces the all-top-1 path in.
accept: each node is right when its token equals the target's choice after its parent; the accepted path is
    the deepest node whose whole ancestry is right (siblings hold distinct tokens, so it is unique).
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from ..kernels import tree as tree_kernel

NEG = -1e30


@dataclass
class Tree:
    tokens: torch.Tensor      # [N] node tokens; node 0 is the root (the last committed token)
    parents: torch.Tensor     # [N] parent node index, -1 for the root
    depth: torch.Tensor       # [N] 0 for the root
    ancestors: torch.Tensor   # [N, N] bool: ancestors[n, a] = a is n or an ancestor of n


# On CUDA the build runs as one Triton program (kernels/tree.py) instead of this file's ~170 tensor ops: 1.75 against
# 2.21 ms for a budget-22 draft + build on the 27B (H200, 2026-12-05, A B A B; BENCHMARKS.md).
# DFLASH24_FUSED_TREE=0: the PyTorch reference below on CUDA too.
FUSED = os.environ.get("DFLASH24_FUSED_TREE", "1") != "0"


def build_tree(root: torch.Tensor, logp: torch.Tensor, tok: torch.Tensor, budget: int, chain_seed: bool = True) -> Tree:
    """root [1]; logp, tok [D, K] (sorted descending per row). Returns a tree of budget + 1 nodes."""
    if FUSED and logp.is_cuda and tree_kernel.HAVE_TRITON:
        return Tree(*tree_kernel.build_tree(root, logp, tok, budget, chain_seed))
    return reference_build_tree(root, logp, tok, budget, chain_seed)


def reference_build_tree(root: torch.Tensor, logp: torch.Tensor, tok: torch.Tensor, budget: int,
                         chain_seed: bool = True) -> Tree:
    """build_tree as PyTorch tensor ops (CPU, and the reference of kernels/tree.py)."""
    D, K = logp.shape
    dev = logp.device
    W = budget                                                   # beam width per depth
    scores, parents, ranks = [], [], []
    beam = logp[0].new_full((W,), NEG)
    n0 = min(K, W)
    beam[:n0] = logp[0, :n0]
    beam_parent = torch.full((W,), -1, dtype=torch.long, device=dev)
    beam_rank = torch.zeros(W, dtype=torch.long, device=dev)
    beam_rank[:n0] = torch.arange(n0, device=dev)
    scores.append(beam), parents.append(beam_parent), ranks.append(beam_rank)
    for d in range(1, D):
        cand = (beam.unsqueeze(1) + logp[d].unsqueeze(0) - 1e-4).reshape(-1)        # [W*K], strictly below parent
        best, idx = torch.topk(cand, W)                                              # sorted: entry 0 = top-1 chain
        beam = best
        scores.append(beam), parents.append(idx // K), ranks.append(idx % K)
    S = torch.stack(scores)                                      # [D, W]
    P = torch.stack(parents)                                     # [D, W] beam index at depth d-1
    R = torch.stack(ranks)                                       # [D, W] rank of the token at depth d
    if chain_seed:                                               # the all-top-1 path goes in first
        on_chain = [R[0] == 0]
        for d in range(1, D):
            on_chain.append(on_chain[-1][P[d]] & (R[d] == 0))
        forced = torch.stack(on_chain) & (S > NEG / 2)
        S = torch.where(forced, 1e4 - torch.arange(D, device=dev, dtype=S.dtype).unsqueeze(1), S)
    flat = S.reshape(-1)
    keep = torch.topk(flat, budget).indices                      # [budget] entries (d * W + w)
    keep = torch.sort(keep).values                               # depth-major order: parents come first
    d_of, w_of = keep // W, keep % W
    node_of = torch.zeros(D * W, dtype=torch.long, device=dev)   # entry -> node index (1..budget)
    node_of[keep] = torch.arange(1, budget + 1, device=dev)
    parent_entry = (d_of - 1) * W + P[d_of, w_of]
    parent_node = torch.where(d_of == 0, torch.zeros_like(d_of), node_of[parent_entry.clamp(min=0)])
    tokens = torch.cat([root.view(1).long(), tok[d_of, R[d_of, w_of]]])
    parents_all = torch.cat([torch.full((1,), -1, dtype=torch.long, device=dev), parent_node])
    depth = torch.cat([torch.zeros(1, dtype=torch.long, device=dev), d_of + 1])
    return Tree(tokens, parents_all, depth, ancestor_mask(parents_all, D))


def ancestor_mask(parents: torch.Tensor, generations: int) -> torch.Tensor:
    """[N, N] bool: mask[n, a] iff a is n or one of its ancestors, for parents [N] (-1: no parent in the tree; any
    number of such roots) of trees at most `generations` levels below their roots. Fixed-shape device work."""
    n = parents.shape[0]
    up = torch.where(parents < 0, torch.arange(n, device=parents.device), parents)   # a root is its own parent
    anc = torch.eye(n, dtype=torch.bool, device=parents.device)
    for _ in range(generations):                                 # each pass adds one more generation
        anc = anc | anc[up]
    return anc


def tree_mask(ancestors: torch.Tensor, pos: torch.Tensor, kv_rows: int) -> torch.Tensor:
    """[N, kv_rows] attention visibility of a tree's nodes: every node sees the committed context (rows < pos)
    and its own ancestors in the tree rows pos .. pos+N-1 (node n is written at row pos + n).
    ancestors [N, N] bool; pos [1] int64 (device)."""
    N = ancestors.shape[0]
    rows = torch.arange(kv_rows, device=pos.device)
    rel = rows - pos.view(1)                                     # [S] row offset inside the tree block
    in_tree = (rel >= 0) & (rel < N)
    tree_vis = ancestors[:, rel.clamp(0, N - 1)] & in_tree.unsqueeze(0)
    return (rows < pos.view(1)).unsqueeze(0) | tree_vis


def accept(tree: Tree, chosen: torch.Tensor) -> torch.Tensor:
    """chosen [N]: the target's token after each node. Returns the deepest node whose path is accepted."""
    right = tree.tokens == chosen[tree.parents.clamp(min=0)]
    right[0] = True
    path_right = ~(tree.ancestors & ~right.unsqueeze(0)).any(-1)                      # [N]
    return torch.argmax(torch.where(path_right, tree.depth, -1))
