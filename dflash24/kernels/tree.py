"""The DDTree build (`spec.ddtree.build_tree`) as one Triton program (CUDA).

`build_tree` is about 170 small tensor ops (a top-k per depth, the chain-seed walk, the global top-k, the ancestor
passes): inside the drafting CUDA graph each is still a kernel of a few microseconds, most of them on one SM. Here
the same selection runs in one program of 4 warps:

1. per depth d, the candidates beam[w] + logp[d, k] - 1e-4 (w < budget, k < K; the same two fp32 roundings as the
   reference) sorted as int64 keys: the fp32 value in order-preserving bits above, 2^31 - 1 - (w K + k) below, so
   equal values keep the lower flat index first; the best `budget` of them are the next beam (value, parent w,
   rank k), written to a scratch row;
2. the chain seed: the beam entry of depth d whose parent is depth d - 1's chain entry and whose rank is 0, carried
   from depth to depth (its score replaced by 1e4 - d, as in the reference);
3. the best `budget` entries of all depths by the same kind of key (d W + w below): a threshold at the budget-th
   key, the node of an entry its rank in entry order (a cumulative sum), so parents come first;
4. tokens, parents and depths of the nodes, then the ancestor mask by walking every node up D generations.

On inputs without ties (equal values in a candidate list) the tree is the reference's, tensor for tensor (tested
under the CPU interpreter); with ties, torch.topk may order the equal entries differently: both are then trees of
the same best scores. PyTorch reference: `spec.ddtree.reference_build_tree` (what `build_tree` runs on the CPU,
and on CUDA with `ddtree.FUSED` off, DFLASH24_FUSED_TREE=0).
"""
from __future__ import annotations

import torch

from . import HAVE_TRITON, tl, triton

if HAVE_TRITON:
    NEG = tl.constexpr(-1e30)   # spec.ddtree.NEG: a beam entry that holds no node

    @triton.jit
    def _key(v, idx):
        """int64 sort keys of fp32 values v and int32 indices idx: value order above, then lower idx first."""
        b = v.to(tl.int32, bitcast=True)
        ordered = b ^ ((b >> 31) & 0x7FFFFFFF)                   # signed-int order = float order
        return (ordered.to(tl.int64) << 32) | (0x7FFFFFFF - idx).to(tl.int64)

    @triton.jit
    def _key_value(key):
        hi = (key >> 32).to(tl.int32)
        return (hi ^ ((hi >> 31) & 0x7FFFFFFF)).to(tl.float32, bitcast=True)

    @triton.jit
    def _key_index(key):
        return 0x7FFFFFFF - (key & 0x7FFFFFFF).to(tl.int32)

    @triton.jit
    def _build_tree_kernel(root_ptr, logp_ptr, tok_ptr, s_ptr, p_ptr, r_ptr, node_ptr, tokens_ptr, parents_ptr,
                           depth_ptr, anc_ptr, D: tl.constexpr, K: tl.constexpr, W: tl.constexpr,
                           DP: tl.constexpr, KP: tl.constexpr, WP: tl.constexpr, NP: tl.constexpr,
                           CHAIN_SEED: tl.constexpr):
        """One program. logp / tok (D, K) row-major (logp fp32, sorted descending per row; tok int64); W = budget.
        Scratch (D, WP): s fp32 beam values, p / r int32 beam parents / ranks, node int32 entry -> node. Out:
        tokens / parents / depth (W + 1,) int64, anc (W + 1, W + 1) uint8."""
        wv = tl.arange(0, WP)
        # depth 0: the first min(K, W) ranks, NEG beyond (as the reference's beam)
        lp0 = tl.load(logp_ptr + wv, mask=wv < K, other=NEG)
        tl.store(s_ptr + wv, lp0)
        tl.store(p_ptr + wv, tl.full([WP], -1, tl.int32))
        tl.store(r_ptr + wv, tl.where(wv < K, wv, 0))
        dv = tl.arange(0, DP)
        chain = tl.where(dv == 0, 0, -1)                          # chain entry per depth (-1: none)
        prev = tl.program_id(0) * 0                               # depth 0's chain entry: w = 0
        cw = tl.arange(0, WP)[:, None]                            # candidate (parent w, rank k)
        ck = tl.arange(0, KP)[None, :]
        for d in range(1, D):
            tl.debug_barrier()                                    # depth d - 1's scratch row written
            beam = tl.load(s_ptr + (d - 1) * WP + cw, mask=cw < W, other=NEG)
            lp = tl.load(logp_ptr + d * K + ck, mask=ck < K, other=0.0)
            cand = (beam + lp) - 1e-4
            ok = (cw < W) & (ck < K)
            key = _key(cand, cw * K + ck)
            key = tl.where(ok, key, -0x7FFFFFFFFFFFFFFF)          # padding sorts last
            key = tl.sort(tl.reshape(key, [WP * KP]), descending=True)
            pos = tl.arange(0, WP * KP)
            idx = _key_index(key)
            parent = idx // K
            rank = idx % K
            out = pos < W
            tl.store(s_ptr + d * WP + pos, _key_value(key), mask=out)
            tl.store(p_ptr + d * WP + pos, parent, mask=out)
            tl.store(r_ptr + d * WP + pos, rank, mask=out)
            if CHAIN_SEED:      # (prev -1: no chain entry below; a child of the chain entry has a real score)
                prev = tl.max(tl.where(out & (parent == prev) & (rank == 0), pos, -1), axis=0)
                chain = tl.where(dv == d, prev, chain)
        tl.debug_barrier()
        # the best W entries of all depths
        ed = tl.arange(0, DP)[:, None]
        ew = tl.arange(0, WP)[None, :]
        valid = (ed < D) & (ew < W)
        s = tl.load(s_ptr + ed * WP + ew, mask=valid, other=NEG)
        if CHAIN_SEED:
            s = tl.where(ew == chain[:, None], 1e4 - ed.to(tl.float32), s)
        key = tl.where(valid, _key(s, ed * W + ew), -0x7FFFFFFFFFFFFFFF)
        flat = tl.reshape(key, [DP * WP])
        ranked = tl.sort(flat, descending=True)
        kth = tl.sum(tl.where(tl.arange(0, DP * WP) == W - 1, ranked, 0), axis=0)
        kept = flat >= kth
        node = tl.cumsum(kept.to(tl.int32), axis=0)               # 1..W for the kept entries, in entry order
        e = tl.arange(0, DP * WP)
        tl.store(node_ptr + e, node)
        tl.debug_barrier()
        d_of = e // WP
        par_w = tl.load(p_ptr + e, mask=kept, other=0)
        rank = tl.load(r_ptr + e, mask=kept, other=0)
        par_node = tl.load(node_ptr + (d_of - 1) * WP + par_w, mask=kept & (d_of > 0), other=0)
        tokv = tl.load(tok_ptr + d_of * K + rank, mask=kept, other=0)
        tl.store(tokens_ptr + node, tokv, mask=kept)
        tl.store(parents_ptr + node, par_node.to(tl.int64), mask=kept)
        tl.store(depth_ptr + node, (d_of + 1).to(tl.int64), mask=kept)
        tl.store(tokens_ptr, tl.load(root_ptr))
        tl.store(parents_ptr, -1)
        tl.store(depth_ptr, 0)
        tl.debug_barrier()
        # ancestors: node n and everything up its parent chain (at most D generations)
        n = tl.arange(0, NP)
        cur = tl.where(n <= W, n, -1).to(tl.int64)
        anc = tl.zeros([NP, NP], dtype=tl.int32)
        a = tl.arange(0, NP)[None, :]
        for _ in range(D + 1):
            anc = tl.where(a == cur[:, None], 1, anc)
            cur = tl.where(cur > 0, tl.load(parents_ptr + tl.maximum(cur, 0)), -1)
        tl.store(anc_ptr + n[:, None] * (W + 1) + a, anc.to(tl.uint8), mask=(n[:, None] <= W) & (a <= W))


def build_tree(root: torch.Tensor, logp: torch.Tensor, tok: torch.Tensor, budget: int, chain_seed: bool = True):
    """spec.ddtree.build_tree in one launch: root [1]; logp, tok [D, K] (sorted descending per row). Returns the
    tokens, parents, depth [budget + 1] int64 and ancestors [budget + 1, budget + 1] bool of the tree."""
    D, K = logp.shape
    if budget < 1 or D < 1:
        raise ValueError(f"tree build: budget and depth must be >= 1, got {budget}, {D}")
    dev = logp.device
    DP, KP, WP = (triton.next_power_of_2(v) for v in (D, K, budget))
    NP = triton.next_power_of_2(budget + 1)
    s = torch.empty(DP * WP, dtype=torch.float32, device=dev)
    p = torch.empty(DP * WP, dtype=torch.int32, device=dev)
    r = torch.empty(DP * WP, dtype=torch.int32, device=dev)
    node = torch.empty(DP * WP, dtype=torch.int32, device=dev)
    n = budget + 1
    tokens, parents, depth = (torch.empty(n, dtype=torch.long, device=dev) for _ in range(3))
    anc = torch.empty((n, n), dtype=torch.uint8, device=dev)
    _build_tree_kernel[(1,)](root.reshape(1).long(), logp.float().contiguous(), tok.long().contiguous(), s, p, r,
                             node, tokens, parents, depth, anc, D=D, K=K, W=budget, DP=DP, KP=KP, WP=WP, NP=NP,
                             CHAIN_SEED=chain_seed, num_warps=4)
    return tokens, parents, depth, anc.view(torch.bool)
