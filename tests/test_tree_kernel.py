"""The one-program DDTree build (kernels/tree.py) against spec.ddtree.reference_build_tree.

Without CUDA the kernel runs in Triton's interpreter on CPU tensors (conftest sets TRITON_INTERPRET=1). Random
log-probs have no ties, so the trees must be equal tensor for tensor; with ties (equal log-probs, as bf16 logits
give) they must hold the same node scores and be well formed.
"""
from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

pytest.importorskip("triton")

from dflash24.kernels import tree as tree_kernel  # noqa: E402
from dflash24.spec.ddtree import Tree, reference_build_tree  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _draft(D, K, vocab, seed, scale=3.0):
    g = torch.Generator().manual_seed(seed)
    logp, tok = (torch.randn(D, vocab, generator=g) * scale).log_softmax(-1).topk(K, -1)
    return logp, tok


def _fused(root, logp, tok, budget, chain_seed=True):
    out = tree_kernel.build_tree(root.to(DEV), logp.to(DEV), tok.to(DEV), budget, chain_seed)
    return Tree(*(t.cpu() for t in out))


@pytest.mark.parametrize("D,K,budget,chain_seed", [(15, 8, 22, True), (15, 8, 22, False), (15, 8, 5, True),
                                                   (15, 8, 1, True), (15, 4, 40, True), (7, 8, 16, True),
                                                   (3, 6, 9, True), (15, 8, 64, True)])
def test_fused_build_equals_reference(D, K, budget, chain_seed):
    for seed in range(3 if budget <= 16 else 1):          # (the interpreter's sorts are slow)
        logp, tok = _draft(D, K, 300, seed * 31 + budget)
        root = torch.tensor([11])
        ref = reference_build_tree(root, logp, tok, budget, chain_seed)
        got = _fused(root, logp, tok, budget, chain_seed)
        for name in ("tokens", "parents", "depth", "ancestors"):
            assert torch.equal(getattr(got, name), getattr(ref, name)), (name, seed)


def _scores(tree, logp, tok):
    """Each node's score: the sum of the log-probs of the ranks along its path (node -> rank by token)."""
    out = []
    for n in range(1, tree.tokens.shape[0]):
        s, m = 0.0, n
        while m > 0:
            d = int(tree.depth[m]) - 1
            s += float(logp[d][(tok[d] == tree.tokens[m]).nonzero()[0, 0]])
            m = int(tree.parents[m])
        out.append(round(s, 4))
    return sorted(out)


def test_fused_build_with_ties_is_a_tree_of_the_same_scores():
    logp, tok = _draft(15, 8, 300, 5)
    logp = (logp * 4).round() / 4                     # many equal log-probs per row and across rows
    root = torch.tensor([3])
    ref = reference_build_tree(root, logp, tok, 22)
    got = _fused(root, logp, tok, 22)
    assert got.parents[0] == -1 and got.depth[0] == 0 and got.tokens[0] == 3
    assert (got.parents[1:] < torch.arange(1, 23)).all()                      # parents come first
    assert torch.equal(got.depth[1:], got.depth[got.parents[1:]] + 1)
    anc = torch.zeros(23, 23, dtype=torch.bool)
    for n in range(23):
        m = n
        while m >= 0:
            anc[n, m] = True
            m = int(got.parents[m])
    assert torch.equal(got.ancestors, anc)
    assert _scores(got, logp, tok) == _scores(ref, logp, tok)
    paths = set()
    for n in range(1, 23):
        path, m = [], n
        while m > 0:
            path.append(int(got.tokens[m]))
            m = int(got.parents[m])
        paths.add(tuple(reversed(path)))
    chain = tuple(tok[:, 0].tolist())
    assert all(chain[:d] in paths for d in range(1, 16))                       # the chain seed's path


def test_fused_build_rejects_an_empty_tree():
    logp, tok = _draft(15, 8, 300, 0)
    with pytest.raises(ValueError, match="budget"):
        tree_kernel.build_tree(torch.tensor([1]), logp, tok, 0)
