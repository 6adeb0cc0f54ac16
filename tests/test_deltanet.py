"""Gated delta rule: chunked reference == token loop; Triton recurrent kernel == reference (TRITON_INTERPRET=1)."""
import os

import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"             # before triton is imported: run kernels on the CPU

import pytest
import torch.nn.functional as F

from dflash24.kernels import deltanet as dn


def _inputs(T, hk=2, hv=6, dk=16, dv=24, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = dn.l2norm(torch.randn(T, hk, dk, generator=gen)) * dk ** -0.5
    k = dn.l2norm(torch.randn(T, hk, dk, generator=gen))
    v = torch.randn(T, hv, dv, generator=gen)
    g = -F.softplus(torch.randn(T, hv, generator=gen)) * 0.5          # log decay <= 0
    beta = torch.rand(T, hv, generator=gen)
    state = torch.randn(hv, dk, dv, generator=gen) * 0.1
    return q, k, v, g, beta, state


@pytest.mark.parametrize("T,chunk", [(1, 64), (5, 7), (23, 7), (40, 16), (130, 64)])
def test_chunked_equals_recurrent(T, chunk):
    q, k, v, g, beta, s0 = _inputs(T)
    s_ref, s_chk = s0.clone(), s0.clone()
    o_ref = dn.recurrent_ref(q, k, v, g, beta, s_ref)
    o_chk = dn.chunked_ref(q, k, v, g, beta, s_chk, chunk=chunk)
    torch.testing.assert_close(o_chk, o_ref, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(s_chk, s_ref, rtol=1e-4, atol=1e-4)
    assert not torch.equal(s_ref, s0)                                   # the state really moved


def test_tiled_head_order():
    """Value head h must read key head h % Hk: permuting key heads changes exactly the matching value heads."""
    q, k, v, g, beta, s0 = _inputs(6, hk=2, hv=6)
    o = dn.recurrent_ref(q, k, v, g, beta, s0.clone())
    k2 = k.clone()
    k2[:, 1] = dn.l2norm(torch.randn_like(k2[:, 1]))
    o2 = dn.recurrent_ref(q, k2, v, g, beta, s0.clone())
    changed = [(o2[:, h] - o[:, h]).abs().max().item() > 1e-6 for h in range(6)]
    assert changed == [False, True, False, True, False, True]


def test_split_sequence_equals_whole():
    q, k, v, g, beta, s0 = _inputs(30)
    s_whole, s_split = s0.clone(), s0.clone()
    o_whole = dn.chunked_ref(q, k, v, g, beta, s_whole, chunk=8)
    o_a = dn.chunked_ref(q[:11], k[:11], v[:11], g[:11], beta[:11], s_split, chunk=8)
    o_b = [dn.recurrent_ref(q[t:t + 1], k[t:t + 1], v[t:t + 1], g[t:t + 1], beta[t:t + 1], s_split)
           for t in range(11, 30)]
    torch.testing.assert_close(torch.cat([o_a] + o_b), o_whole, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(s_split, s_whole, rtol=1e-4, atol=1e-4)


def test_causal_conv_window():
    gen = torch.Generator().manual_seed(1)
    C, K, T = 10, 4, 9
    x, w = torch.randn(T, C, generator=gen), torch.randn(C, K, generator=gen)
    ref = F.silu(F.conv1d(x.t().unsqueeze(0), w.unsqueeze(1), padding=K - 1, groups=C)[0, :, :T].t())
    win = torch.zeros(K - 1, C)
    parts = [dn.causal_conv(x[:2], win, w)] + [dn.causal_conv(x[t:t + 1], win, w) for t in range(2, 5)]
    parts.append(dn.causal_conv(x[5:], win, w))
    torch.testing.assert_close(torch.cat(parts), ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(win, x[-(K - 1):])


triton_needed = pytest.mark.skipif(dn.triton is None, reason="triton not installed")
DEV = "cuda" if torch.cuda.is_available() else "cpu"      # interpreter on CPU, the real kernel on a GPU


def _tri(q, k, v, g, beta, state, parents=None, states=None):
    """recurrent_triton on DEV; state / states updated in place on the caller's (CPU) tensors."""
    s_dev = state.to(DEV)
    st_dev = None if states is None else states.to(DEV)
    o = dn.recurrent_triton(q.to(DEV), k.to(DEV), v.to(DEV), g.to(DEV), beta.to(DEV), s_dev,
                            parents=None if parents is None else parents.to(DEV), states=st_dev)
    state.copy_(s_dev.cpu())
    if states is not None:
        states.copy_(st_dev.cpu())
    return o.cpu()


@triton_needed
@pytest.mark.parametrize("T,hk,hv,dk,dv", [(1, 2, 6, 16, 24), (5, 2, 4, 32, 16), (9, 1, 3, 16, 40)])
def test_triton_recurrent_matches_reference(T, hk, hv, dk, dv):
    q, k, v, g, beta, s0 = _inputs(T, hk, hv, dk, dv, seed=T)
    s_ref, s_tri = s0.clone(), s0.clone()
    o_ref = dn.recurrent_ref(q, k, v, g, beta, s_ref)
    o_tri = _tri(q, k, v, g, beta, s_tri)
    torch.testing.assert_close(o_tri, o_ref, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(s_tri, s_ref, rtol=1e-4, atol=1e-4)


@triton_needed
def test_triton_chain_states_and_tree_parents():
    T, hk, hv, dk, dv = 6, 2, 4, 16, 16
    q, k, v, g, beta, s0 = _inputs(T, hk, hv, dk, dv, seed=3)
    # chain: per-token states let a verifier roll back to any accepted prefix
    st_ref, st_tri = torch.zeros(T, hv, dk, dv), torch.zeros(T, hv, dk, dv)
    s_ref, s_tri = s0.clone(), s0.clone()
    dn.recurrent_ref(q, k, v, g, beta, s_ref, states=st_ref)
    _tri(q, k, v, g, beta, s_tri, states=st_tri)
    torch.testing.assert_close(st_tri, st_ref, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(st_ref[-1], s_ref)
    # tree: root children 0 and 3; 1 <- 0, 2 <- 1, 4 <- 3, 5 <- 0
    parents = torch.tensor([-1, 0, 1, -1, 3, 0], dtype=torch.int32)
    st_ref.zero_(), st_tri.zero_()
    s_ref, s_tri = s0.clone(), s0.clone()
    o_ref = dn.recurrent_ref(q, k, v, g, beta, s_ref, parents=parents, states=st_ref)
    o_tri = _tri(q, k, v, g, beta, s_tri, parents=parents, states=st_tri)
    torch.testing.assert_close(o_tri, o_ref, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(st_tri, st_ref, rtol=1e-4, atol=1e-4)
    assert torch.equal(s_tri, s0) and torch.equal(s_ref, s0)            # committed state untouched
    # node 4's path is [3, 4]: the same as running tokens 3, 4 as a chain from the committed state
    path = torch.tensor([3, 4])
    s_chain = s0.clone()
    o_chain = dn.recurrent_ref(q[path], k[path], v[path], g[path], beta[path], s_chain)
    torch.testing.assert_close(o_ref[path], o_chain, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(st_ref[4], s_chain, rtol=1e-4, atol=1e-4)
