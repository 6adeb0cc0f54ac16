"""Triton cache attention (dflash24/kernels/attention.py) vs the PyTorch reference (dense mask + fp32 math).

Without CUDA the kernel runs in Triton's CPU interpreter on tiny shapes; `-m gpu` runs real sizes.
Tolerance: max|o - ref| <= TOL[dtype] (absolute; outputs are convex combinations of N(0,1) values, so
|ref| <= ~4). fp32: fp32 dots ("ieee") -> 1e-4. bf16: the output is rounded to bf16 (2^-9 relative,
~8e-3 at |o| ~ 4) and on a GPU P is rounded to bf16 before the PV dot -> 2e-2. fp16: 5e-3.
"""
from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    # Must be set before triton is imported: kernels are built as interpreted functions then.
    os.environ["TRITON_INTERPRET"] = "1"

import pytest

triton = pytest.importorskip("triton")

from dflash24.kernels import attention as A  # noqa: E402
from dflash24.models.layers import Step, cache_attention  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
TOL = {torch.float32: 1e-4, torch.bfloat16: 2e-2, torch.float16: 5e-3}


def _cache(cap, Hk, D, dtype, gen, device=DEV):
    k = torch.randn(cap, Hk, D, generator=gen).to(dtype).to(device)
    v = torch.randn(cap, Hk, D, generator=gen).to(dtype).to(device)
    return k, v


def _check(o, ref, dtype):
    assert o.shape == ref.shape and o.dtype == ref.dtype
    assert torch.isfinite(o.float()).all()
    tol = max(TOL[dtype], TOL[o.dtype])            # cache dtype and output (= query) dtype
    err = (o.float() - ref.float()).abs().max().item()
    assert err <= tol, f"max abs err {err} > {tol}"


def _seq_case(T, H, Hk, D, ctx, dtype, seed, n_splits=None, extra_rows=5, q_dtype=None, device=DEV):
    """T queries at slots ctx-T .. ctx-1 (positions start = ctx - T); kv_rows = ctx + extra (bucket)."""
    gen = torch.Generator().manual_seed(seed)
    kv_rows = ctx + extra_rows
    k, v = _cache(kv_rows + 3, Hk, D, dtype, gen, device)
    q = torch.randn(T, H, D, generator=gen).to(q_dtype or dtype).to(device)
    slots = torch.arange(ctx - T, ctx, device=device)
    o = A.attention(q, k, v, D ** -0.5, kv_rows, slots=slots, n_splits=n_splits)
    ref = A.attention_ref(q, k, v, D ** -0.5, kv_rows, slots=slots)
    _check(o, ref, dtype)
    # rows beyond the slots do not matter: poison them, same result
    k[ctx:], v[ctx:] = float("nan"), float("nan")
    o2 = A.attention(q, k, v, D ** -0.5, kv_rows, slots=slots, n_splits=n_splits)
    assert torch.equal(o, o2)


def random_tree(n, gen):
    """parents (topological, -1 for the root) and the [n, n] ancestors-or-self matrix of a random tree."""
    parents = [-1] + [int(torch.randint(0, i, (1,), generator=gen)) for i in range(1, n)]
    anc = torch.eye(n, dtype=torch.bool)
    for i in range(1, n):
        anc[i] |= anc[parents[i]]
    return torch.tensor(parents), anc


# --------------------------------------------------------------------------------------------------
# decode, T = 1 (split-KV + reduction and the single-program path)
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("ctx", [1, 33, 100, 200])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decode(ctx, dtype):
    _seq_case(1, 4, 2, 64, ctx, dtype, seed=ctx)


@pytest.mark.parametrize("n_splits", [1, 2, 5])
def test_decode_forced_splits_gqa6(n_splits):
    _seq_case(1, 12, 2, 64, 150, torch.bfloat16, seed=7, n_splits=n_splits)


def test_decode_more_splits_than_tiles():
    """Splits beyond the last tile are empty (max -1e30, sum 0) and must not disturb the merge."""
    _seq_case(1, 2, 2, 64, 20, torch.float32, seed=3, n_splits=6)


# --------------------------------------------------------------------------------------------------
# chain verification T = 16, prefill T = 80 from a non-zero start
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("H,Hk", [(2, 2), (4, 2), (6, 1)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_verify_chain_16(H, Hk, dtype):
    _seq_case(16, H, Hk, 64, 90, dtype, seed=H * 10 + Hk)


@pytest.mark.parametrize("n_splits", [None, 1])
def test_prefill_80_nonzero_start(n_splits):
    _seq_case(80, 4, 2, 64, 150, torch.bfloat16, seed=11, n_splits=n_splits)


def test_prefill_fp32_gqa6_query_dtype_differs():
    _seq_case(80, 6, 1, 64, 100, torch.float32, seed=12, q_dtype=torch.bfloat16)


# --------------------------------------------------------------------------------------------------
# tree verification: random trees of 8..23 nodes after a committed context
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("n,H,Hk,dtype", [(8, 4, 2, torch.float32), (13, 6, 1, torch.bfloat16),
                                          (23, 2, 2, torch.bfloat16), (17, 12, 2, torch.float32)])
def test_tree(n, H, Hk, dtype):
    gen = torch.Generator().manual_seed(n)
    D, ctx = 64, 45
    kv_rows = ctx + n + 9
    k, v = _cache(kv_rows + 2, Hk, D, dtype, gen)
    q = torch.randn(n, H, D, generator=gen).to(dtype).to(DEV)
    _, anc = random_tree(n, gen)
    big = torch.zeros(32, 32, dtype=torch.bool)       # as the runner: a slice of a larger static buffer
    big[:n, :n] = anc
    anc_view = big.to(DEV)[:n, :n]
    base = torch.tensor([ctx], device=DEV)
    for n_splits in (None, 1, 3):
        o = A.attention(q, k, v, D ** -0.5, kv_rows, base=base, ancestors=anc_view, n_splits=n_splits)
        ref = A.attention_ref(q, k, v, D ** -0.5, kv_rows, base=base, ancestors=anc_view)
        _check(o, ref, dtype)
    # the reference mask is the engine's tree_mask (the SDPA path of a tree step)
    from dflash24.spec.ddtree import tree_mask
    assert torch.equal(A.dense_visibility(n, kv_rows, base=base.cpu(), ancestors=anc),
                       tree_mask(anc, base.cpu(), kv_rows))


# --------------------------------------------------------------------------------------------------
# sliding window (--attn-window): the kernel against the SDPA path of the same Step (dense mask)
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("T,ctx,window", [(1, 100, 32), (1, 20, 32), (16, 90, 40), (80, 120, 33)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sliding_window_sequential(T, ctx, window, dtype):
    gen = torch.Generator().manual_seed(T + ctx)
    H, Hk, D = 4, 2, 64
    kv_rows = ctx + 3
    k, v = _cache(kv_rows + 2, Hk, D, dtype, gen)
    q = torch.randn(T, H, D, generator=gen).to(dtype).to(DEV)
    pos = torch.arange(ctx - T, ctx, device=DEV)
    step = Step(pos.cpu(), pos.cpu(), kv_rows, window=window)
    ref = cache_attention(q.cpu(), k.cpu(), v.cpu(), step, D ** -0.5)       # SDPA with the windowed mask
    for n_splits in (None, 1, 3):
        o = A.attention(q, k, v, D ** -0.5, kv_rows, slots=pos, n_splits=n_splits, positions=pos, window=window)
        _check(o.cpu(), ref, dtype)
    if ctx <= window:                                 # nothing is cut: the full-attention result
        _check(A.attention(q, k, v, D ** -0.5, kv_rows, slots=pos).cpu(), ref, dtype)
    else:                                             # rows before the window do not matter: poison them
        k[:ctx - T - window + 1], v[:ctx - T - window + 1] = float("nan"), float("nan")
        o = A.attention(q, k, v, D ** -0.5, kv_rows, slots=pos, positions=pos, window=window)
        _check(o.cpu(), ref, dtype)


def test_sliding_window_tree():
    gen = torch.Generator().manual_seed(7)
    n, H, Hk, D, ctx, window = 13, 6, 1, 64, 70, 33
    kv_rows = ctx + n + 4
    k, v = _cache(kv_rows + 2, Hk, D, torch.float32, gen)
    q = torch.randn(n, H, D, generator=gen).to(DEV)
    _, anc = random_tree(n, gen)
    base = torch.tensor([ctx])
    pos = base + anc.sum(1) - 1                       # a node sits one position below its depth
    step = Step(pos, base + torch.arange(n), kv_rows, tree=(base, anc), speculative=True, window=window)
    ref = cache_attention(q.cpu(), k.cpu(), v.cpu(), step, D ** -0.5)
    for n_splits in (None, 1, 3):
        o = A.attention(q, k, v, D ** -0.5, kv_rows, base=base.to(DEV), ancestors=anc.to(DEV), n_splits=n_splits,
                        positions=pos.to(DEV), window=window)
        _check(o.cpu(), ref, torch.float32)
    full = A.attention(q, k, v, D ** -0.5, kv_rows, base=base.to(DEV), ancestors=anc.to(DEV))
    assert (full.cpu() - ref).abs().max() > 1e-3     # the window does cut something here


# --------------------------------------------------------------------------------------------------
# head dim 256 (qwen35), small T / S
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("T,ctx", [(1, 70), (5, 40)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_head_dim_256(T, ctx, dtype):
    _seq_case(T, 6, 1, 256, ctx, dtype, seed=T + ctx)


def test_head_dim_256_tree():
    gen = torch.Generator().manual_seed(5)
    n, H, Hk, D, ctx = 9, 4, 2, 256, 20
    k, v = _cache(ctx + n + 4, Hk, D, torch.bfloat16, gen)
    q = torch.randn(n, H, D, generator=gen).to(torch.bfloat16).to(DEV)
    _, anc = random_tree(n, gen)
    base = torch.tensor([ctx], device=DEV)
    o = A.attention(q, k, v, D ** -0.5, ctx + n + 4, base=base, ancestors=anc.to(DEV))
    ref = A.attention_ref(q, k, v, D ** -0.5, ctx + n + 4, base=base, ancestors=anc.to(DEV))
    _check(o, ref, torch.bfloat16)


# --------------------------------------------------------------------------------------------------
# host-side validation and the layers.py dispatch
# --------------------------------------------------------------------------------------------------
def test_errors():
    q = torch.zeros(2, 4, 64)
    k = torch.zeros(10, 2, 64)
    with pytest.raises(ValueError):
        A.attention(q, k, k, 1.0, 10)                                         # neither rule
    with pytest.raises(ValueError):
        A.attention(q, k, k, 1.0, 11, slots=torch.arange(2))                 # kv_rows > capacity
    with pytest.raises(ValueError):
        A.attention(q, k, k, 1.0, 10, base=torch.tensor([3]), ancestors=torch.ones(3, 3, dtype=torch.bool))
    with pytest.raises(ValueError):
        A.attention(torch.zeros(2, 4, 80), torch.zeros(10, 2, 80), torch.zeros(10, 2, 80), 1.0, 10,
                    slots=torch.arange(2))                                     # head dim 80


def test_step_dense_visibility_tree_matches_mask():
    """Step(tree=...) on the SDPA path builds the same dense mask as the old mask= form."""
    gen = torch.Generator().manual_seed(1)
    n, ctx, rows = 7, 12, 24
    _, anc = random_tree(n, gen)
    base = torch.tensor([ctx])
    st = Step(base + torch.arange(n), base + torch.arange(n), rows, tree=(base, anc))
    assert torch.equal(st.dense_visibility(), A.dense_visibility(n, rows, base=base, ancestors=anc))
    q = torch.randn(n, 4, 16, generator=gen)
    k, v = torch.randn(rows, 2, 16, generator=gen), torch.randn(rows, 2, 16, generator=gen)
    if not torch.cuda.is_available():          # CPU: cache_attention keeps the SDPA path
        assert st.visibility() is not None and not st.fused()
        o = cache_attention(q, k, v, st, 0.25)
        o_mask = cache_attention(q, k, v, Step(st.positions, st.slots, rows, mask=st.dense_visibility()), 0.25)
        assert torch.equal(o, o_mask)


# --------------------------------------------------------------------------------------------------
# GPU, real sizes (pytest -m gpu)
# --------------------------------------------------------------------------------------------------
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("T,ctx", [(1, 8192), (1, 8191), (1, 777), (16, 8192), (23, 4100), (512, 8192),
                                   (512, 700)])
@pytest.mark.parametrize("H,Hk,D", [(16, 4, 256), (24, 4, 256), (28, 4, 128), (14, 2, 64)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gpu_sequential_real(T, ctx, H, Hk, D, dtype):
    _seq_case(T, H, Hk, D, ctx, dtype, seed=T + ctx, extra_rows=300)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("n", [8, 23, 65])
@pytest.mark.parametrize("H,Hk,D", [(24, 4, 256), (28, 4, 128)])
def test_gpu_tree_real(n, H, Hk, D):
    gen = torch.Generator().manual_seed(n)
    ctx, cap = 8000, 8192 + 256
    k, v = _cache(cap, Hk, D, torch.bfloat16, gen)
    q = torch.randn(n, H, D, generator=gen).to(torch.bfloat16).cuda()
    big = torch.zeros(80, 80, dtype=torch.bool)
    big[:n, :n] = random_tree(n, gen)[1]
    anc = big.cuda()[:n, :n]
    base = torch.tensor([ctx], device="cuda")
    o = A.attention(q, k, v, D ** -0.5, 8192, base=base, ancestors=anc)
    ref = A.attention_ref(q, k, v, D ** -0.5, 8192, base=base, ancestors=anc)
    _check(o, ref, torch.bfloat16)


@pytest.mark.gpu
@needs_cuda
def test_gpu_fp32_and_graph_capture():
    """fp32 cache (ieee dots) and replay from a CUDA graph with changed slots/base (no host syncs)."""
    gen = torch.Generator().manual_seed(0)
    H, Hk, D, rows = 24, 4, 256, 4096
    k, v = _cache(rows, Hk, D, torch.float32, gen)
    q = torch.randn(16, H, D, generator=gen).cuda()
    slots = torch.arange(1000, 1016, device="cuda")
    _check(A.attention(q, k, v, D ** -0.5, rows, slots=slots),
           A.attention_ref(q, k, v, D ** -0.5, rows, slots=slots), torch.float32)
    kb, vb, qb = k.bfloat16(), v.bfloat16(), q.bfloat16()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        A.attention(qb, kb, vb, D ** -0.5, rows, slots=slots)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = A.attention(qb, kb, vb, D ** -0.5, rows, slots=slots)
    for start in (100, 3000, 4080):
        slots.copy_(torch.arange(start, start + 16, device="cuda"))
        g.replay()
        _check(out, A.attention_ref(qb, kb, vb, D ** -0.5, rows, slots=slots), torch.bfloat16)


@pytest.mark.gpu
@needs_cuda
def test_gpu_cache_attention_dispatch():
    """layers.cache_attention on CUDA: sequential and tree steps go to the kernel and match SDPA."""
    gen = torch.Generator().manual_seed(2)
    H, Hk, D, rows, n = 24, 4, 256, 2048, 23
    k, v = _cache(rows, Hk, D, torch.bfloat16, gen)
    q = torch.randn(n, H, D, generator=gen).to(torch.bfloat16).cuda()
    base = torch.tensor([1500], device="cuda")
    anc = random_tree(n, gen)[1].cuda()
    for st in (Step(base + torch.arange(n, device="cuda"), base + torch.arange(n, device="cuda"), rows),
               Step(base + torch.arange(n, device="cuda"), base + torch.arange(n, device="cuda"), rows,
                    tree=(base, anc))):
        assert st.fused() and st.visibility() is None
        o = cache_attention(q, k, v, st, D ** -0.5)
        o_sdpa = cache_attention(q, k, v, Step(st.positions, st.slots, rows, mask=st.dense_visibility()), D ** -0.5)
        _check(o, o_sdpa, torch.bfloat16)


@pytest.mark.parametrize("kv", ["f32", "q8_0"])
def test_batch_invariant_rows(kv, monkeypatch):
    """DFLASH24_BATCH_INVARIANT: a token's output is the same bits whether it is decoded alone (AR, KV rows of
    its bucket) or is one of a 16-token verify step (its own rows); the default heuristics, which pick tiles
    and splits from the step size, need not give the same bits."""
    from dflash24.cache.kvquant import encode, PackedKV
    g = torch.Generator().manual_seed(11)
    cap, H, Hk, D = 1024, 6, 2, 64
    k, v = _cache(cap, Hk, D, torch.float32, g)
    if kv != "f32":
        k, v = PackedKV(encode(k, kv), kv, D), PackedKV(encode(v, kv), kv, D)
    q = torch.randn(cap, H, D, generator=g).to(DEV)

    def rows(start, n, kv_rows):
        return A.attention(q[start:start + n], k, v, D ** -0.5, kv_rows,
                           slots=torch.arange(start, start + n, device=DEV))

    def compare():
        same = []
        for s in (0, 240, 505, 760):                      # steps inside one split and across split edges
            verify = rows(s, 16, s + 16)
            for j in (0, 7, 15):
                p = s + j
                bucket = max(256, 1 << p.bit_length())          # the CUDA-graph KV bucket of p + 1 rows
                same.append(torch.equal(rows(p, 1, min(bucket, cap))[0], verify[j]))
        return same

    from dflash24.quant import kernels
    monkeypatch.setattr(kernels, "BATCH_INVARIANT", True)
    assert all(compare())
    monkeypatch.setattr(kernels, "BATCH_INVARIANT", False)
    assert not all(compare())        # here 6 of 12 differ in the last bits: the check above is not vacuous


def test_region_step_equals_its_dense_mask():
    """A `region` step (batched generation: each token reads only its own block of the cache) gives what the
    same step gives with the dense mask over every row, GQA included; its dense form is that mask."""
    g = torch.Generator().manual_seed(4)
    R, nblk, H, Hk, D = 12, 4, 6, 2, 16
    k = torch.randn(R * nblk, Hk, D, generator=g)
    v = torch.randn(R * nblk, Hk, D, generator=g)
    blocks = torch.tensor([0, 2, 3])                 # block 1's sequence has finished
    pos = torch.tensor([5, 0, 11])
    slots = blocks * R + pos
    q = torch.randn(3, H, D, generator=g)
    st = Step(pos, slots, R * nblk, region=R)
    assert st.visibility() is None
    vis = st.dense_visibility()
    rows = torch.arange(R * nblk)
    assert torch.equal(vis, (rows[None] >= (blocks * R)[:, None]) & (rows[None] <= slots[:, None]))
    dense = cache_attention(q, k, v, Step(pos, slots, R * nblk, mask=vis), 0.25)
    torch.testing.assert_close(cache_attention(q, k, v, st, 0.25), dense, rtol=1e-5, atol=1e-6)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("fmt", ["bf16", "q8_0", "q4_0", "tq3"])
@pytest.mark.parametrize("ctx", [3000, 131072])
def test_gpu_ring_equals_full_rows(fmt, ctx):
    """A drafter block step (16 queries, the 27B drafter's heads) over a sliding layer's ring of 3,072 rows
    (position p at row p % ring) gives the output of the same step over full-length rows; rows of the ring
    that hold later positions (scratch written ahead) stay out of sight."""
    from dflash24.cache.kvquant import PackedKV, encode
    gen = torch.Generator().manual_seed(ctx)
    T, H, Hk, D, window, ring = 16, 32, 8, 128, 2048, 3072
    cap = ctx + T + 64
    k, v = _cache(cap, Hk, D, torch.bfloat16, gen, "cuda")
    pos = torch.arange(ctx, ctx + T, device="cuda")
    held = torch.arange(cap, device="cuda")          # the ring holds, per row, the latest position written
    held = held[held >= cap - ring]
    rows = torch.remainder(held, ring)
    kr, vr = torch.empty(ring, Hk, D, dtype=k.dtype, device="cuda"), torch.empty_like(k[:ring])
    kr[rows], vr[rows] = k[held], v[held]
    sides = [(k, v), (kr, vr)]
    if fmt != "bf16":
        sides = [tuple(PackedKV(encode(x, fmt), fmt, D) for x in pair) for pair in sides]
    q = torch.randn(T, H, D, generator=gen).to(torch.bfloat16).cuda()
    (kf, vf), (kq, vq) = sides
    want = A.attention(q, kf, vf, D ** -0.5, cap, slots=pos, positions=pos, window=window)
    got = A.attention(q, kq, vq, D ** -0.5, cap, slots=pos, positions=pos, window=window, ring=ring)
    _check(got, want, torch.bfloat16)
