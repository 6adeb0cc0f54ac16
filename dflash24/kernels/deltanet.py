"""Gated delta rule (Gated DeltaNet, arXiv 2412.06464): PyTorch references, a Triton recurrent kernel, dispatch.

Per value head h with state S_h [Dk, Dv] (fp32), for each token t:
    S <- S * exp(g_t);  delta = beta_t * (v_t - S^T k_t);  S <- S + k_t delta^T;  o_t = S^T q_t
Inputs are already prepared by the layer: q = l2norm(q)/sqrt(Dk), k = l2norm(k), g <= 0 (log decay),
beta in (0, 1). Value heads are in GGUF's TILED order: value head h reads key head h % Hk.

Shapes: q, k [T, Hk, Dk]; v [T, Hv, Dv]; g, beta [T, Hv]; state [Hv, Dk, Dv] fp32 (updated in place);
returns o [T, Hv, Dv] fp32.

Tree verification (DDTree): with `parents` [T] int (token t continues the state of token parents[t];
-1 = the committed `state`), every token's state is written to `states` [T, Hv, Dk, Dv] and `state` is
left untouched; committing node j is `state.copy_(states[j])`. Without `parents`, `states` (optional)
receives the state after every token of the chain. `update_state=False` (chain) leaves `state` untouched too.
Tokens must come in topological order: parents[t] < t.

Speculative verification does not keep per-token states: the layer records each token's recurrence
inputs (k, v, g, beta) and `replay` advances the committed state along the accepted path afterwards.
On CUDA a speculative step of up to 32 tokens, chain or tree, runs `spec_chunk_triton`: its outputs from the
committed state by matrix products (`spec_chunk_ref`), a tree by its ancestor mask, with no per-node states.
"""
from __future__ import annotations

import os

import torch
import torch.nn.functional as F

from ..quant import kernels as _quant_kernels
from . import tl, triton  # None on CPU-only installs: the torch path always exists
from .pdl import launch_options, pdl_enter

try:  # flash-linear-attention: chunked prefill on CUDA when installed (pip: flash-linear-attention)
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule as _fla_chunk
except Exception:  # noqa: BLE001 - any import failure (missing, wrong triton) just disables the path
    _fla_chunk = None

RECURRENT_MAX_T = 64        # at most this many tokens use the recurrent kernel on CUDA (decode, verify)
# The recurrent kernel loads token t + 1's inputs during token t's step (its PREFETCH) when a call has several
# tokens (verify steps); DFLASH24_RECURRENT_PREFETCH=0 loads each token's inputs in its own step.
RECURRENT_PREFETCH = os.environ.get("DFLASH24_RECURRENT_PREFETCH", "1") != "0"
# Speculative steps (chain and tree verification) of up to SPEC_CHUNK_MAX_T tokens run `spec_chunk_triton` on CUDA
# (matrix products; a tree needs no per-node states); DFLASH24_SPEC_CHUNK=0, or the batch-invariant mode (a token's
# bits must not depend on the step it comes in: only the recurrent kernel computes it as a decode step does): the
# recurrent kernel.
# At most 32 tokens: the chain's 16 and trees of budget up to 31 (64-token tiles need 112 KiB of shared memory, more
# than sm_86 gives a program, and take minutes to compile).
SPEC_CHUNK = os.environ.get("DFLASH24_SPEC_CHUNK", "1") != "0"
SPEC_CHUNK_MAX_T = 32
# Input precision of its products with the state (Q S0, K S0) and among the step's tokens (K K^T, Q K^T, the
# substitution, the updates): "tf32x3" (three tf32 tensor-core products, near fp32), "tf32" or "ieee" (fp32 FMAs).
# Among the tokens tf32 (outputs within 2e-3 of their max of the near-fp32 form): on the 27B it takes 0.35 ms off a
# 16-token verify and 0.4 ms off a 23-node tree verify, and leaves the verify's logits as far from the decode's as
# before (benchmarks/diag_verify_numerics.py: median distance 0.083 against 0.082, BENCHMARKS.md 2026-12-04).
SPEC_CHUNK_PRECISION = tuple(os.environ.get("DFLASH24_SPEC_CHUNK_PRECISION", "tf32x3,tf32").split(","))
SPEC_CHUNK_KC = 16          # Dk columns per product step (32 or more: ptxas spills at Dk 128)
# The products with the state (K S0, Q S0) and those among the tokens (K K^T, Q K^T) in two loops over Dk
# (`_spec_chunk_kernel` TWO_LOOPS). In one loop Triton lays all four out as one chain of dots and, the token tile
# being square, puts the warps along its rows: every warp then computed the whole [BT, BV] K S0 and Q S0 (sm_90, 16
# tokens, 32 columns: 56 mma a Dk step a warp, 196 registers; in two loops 12 mma, 80 registers).
SPEC_CHUNK_TWO_LOOPS = True
# (value columns a program, warps). The kernel is launched without PDL (kernels/pdl.py OFF_ALWAYS), as measured
# below: with it, this light grid, scheduled while the kernel before still runs, likely piles up on the few SMs
# that come free first.
# H100, 2026-12-06 (BENCHMARKS.md; us per launch, bench_spec_delta at 16 / 23 tokens: one loop, 32 x 4, as before
# -> two loops): 32 x 4 10.27 / 19.60 -> 8.62 / 18.67, 32 x 2 6.81 / 14.59, 64 x 4 7.06 / 13.02, 64 x 8 9.77 /
# 16.27. In the 27B's CUDA-graph steps (ab_steps.py, ms, verify 16 / tree verify 23): one loop 32 x 4 with PDL
# (before) 10.04-10.06 / 12.45-12.47; two loops with PDL 32 x 4 10.35 / 12.54-12.57, 32 x 2 10.30-10.31 /
# 12.73-12.74; without PDL 32 x 4 10.04 / 12.64-12.67, 32 x 2 9.97-9.99 / 12.47-12.53, 64 x 4 9.97-9.98 /
# 12.39. (H200, 2026-12-03: 16 columns with 8 warps 2.7-3.4x slower.)
SPEC_CHUNK_TILE = (64, 4)


def _spec_chunk(T: int) -> bool:
    return SPEC_CHUNK and T <= SPEC_CHUNK_MAX_T and not _quant_kernels.BATCH_INVARIANT


def tree_states_needed(nodes: int) -> bool:
    """Whether a CUDA tree step of `nodes` nodes runs the recurrent kernel, which keeps every node's state
    ([nodes, Hv, Dk, Dv] fp32, shared by the layers), rather than `spec_chunk_triton`."""
    return nodes > 0 and not _spec_chunk(nodes)


def _tiled(x: torch.Tensor, hv: int) -> torch.Tensor:
    """[T, Hk, D] -> [T, Hv, D] in tiled order (value head h gets key head h % Hk)."""
    hk = x.shape[1]
    if hv % hk:
        raise ValueError(f"value heads ({hv}) must be a multiple of key heads ({hk})")
    return x.repeat(1, hv // hk, 1)


# ---------------------------------------------------------------------------------------------------
# PyTorch references
# ---------------------------------------------------------------------------------------------------
def recurrent_ref(q, k, v, g, beta, state, parents=None, states=None, update_state: bool = True) -> torch.Tensor:
    """Token-by-token reference (the definition). See the module docstring for the contract."""
    T, hv = v.shape[0], v.shape[1]
    qh, kh = _tiled(q.float(), hv), _tiled(k.float(), hv)                 # [T, Hv, Dk]
    v, g, beta = v.float(), g.float(), beta.float()
    o = torch.empty(T, hv, v.shape[2], dtype=torch.float32, device=v.device)
    S = state.clone()
    per_token = []
    for t in range(T):
        if parents is not None:
            p = int(parents[t])
            if p >= t:
                raise ValueError(f"parents must be topologically ordered (parents[t] < t); parents[{t}] = {p}")
            S = state.clone() if p < 0 else per_token[p]
        S = S * g[t].exp()[:, None, None]
        kv = torch.einsum("hk,hkv->hv", kh[t], S)                          # S^T k  [Hv, Dv]
        delta = beta[t][:, None] * (v[t] - kv)
        S = S + kh[t][:, :, None] * delta[:, None, :]
        o[t] = torch.einsum("hk,hkv->hv", qh[t], S)
        per_token.append(S)
        if states is not None:
            states[t].copy_(S)
    if parents is None and update_state:
        state.copy_(S)
    return o


def chunked_ref(q, k, v, g, beta, state, chunk: int = 64, update_state: bool = True) -> torch.Tensor:
    """Chunked (WY / UT-transform) form of the same recurrence, fp32; updates `state` in place.

    Inside a chunk with cumulative log decay G_t (Gamma_t = exp(G_t)) starting from state S0:
      (I + L) Delta = beta*V - beta*Gamma*K S0,  L[t,s] = beta_t (k_t.k_s) exp(G_t - G_s) for s < t
      O = (Gamma*Q) S0 + ((Q K^T) o exp(G_t - G_s))_{s<=t} Delta
      S_end = Gamma_C S0 + (K * exp(G_C - G))^T Delta
    """
    T, hv, dv = v.shape
    qh = _tiled(q.float(), hv).transpose(0, 1)                             # [Hv, T, Dk]
    kh = _tiled(k.float(), hv).transpose(0, 1)
    vh = v.float().transpose(0, 1)                                         # [Hv, T, Dv]
    gh, bh = g.float().t(), beta.float().t()                               # [Hv, T]
    S = state.clone()
    o = torch.empty(hv, T, dv, dtype=torch.float32, device=v.device)
    for s in range(0, T, chunk):
        e = min(s + chunk, T)
        qc, kc, vc, bc = qh[:, s:e], kh[:, s:e], vh[:, s:e], bh[:, s:e]
        G = gh[:, s:e].cumsum(-1)                                          # [Hv, C]
        C = e - s
        diff = G[:, :, None] - G[:, None, :]                               # [Hv, C, C]: G_t - G_s
        incl = torch.ones(C, C, dtype=torch.bool, device=v.device).tril()
        decay = diff.masked_fill(~incl, float("-inf")).exp()               # exp(G_t - G_s), s <= t
        kk = kc @ kc.transpose(-1, -2)                                     # [Hv, C, C]
        L = (bc[:, :, None] * kk * decay).tril(-1)
        eye = torch.eye(C, device=v.device).expand_as(L)
        rhs_v = bc[:, :, None] * vc                                        # [Hv, C, Dv]
        rhs_k = (bc * G.exp())[:, :, None] * kc                            # [Hv, C, Dk]
        U = torch.linalg.solve_triangular(eye + L, rhs_v, upper=False, unitriangular=True)
        W = torch.linalg.solve_triangular(eye + L, rhs_k, upper=False, unitriangular=True)
        delta = U - W @ S                                                  # [Hv, C, Dv]
        qk = (qc @ kc.transpose(-1, -2)) * decay
        o[:, s:e] = (qc * G.exp()[:, :, None]) @ S + qk @ delta
        tail = (G[:, -1:] - G).exp()                                       # exp(G_C - G_s) [Hv, C]
        S = S * G[:, -1].exp()[:, None, None] + (kc * tail[:, :, None]).transpose(-1, -2) @ delta
    if update_state:
        state.copy_(S)
    return o.transpose(0, 1).contiguous()


def spec_chunk_ref(q, k, v, g, beta, state, ancestors=None) -> torch.Tensor:
    """The outputs of a speculative step in one chunk (the WY form of `chunked_ref`, fp32), on a chain or a tree;
    `state` is left as it is. ancestors: [T, T] bool, ancestors[t, s] iff token s is token t or one of its
    ancestors (tree verification; topological order: only s <= t); None: a chain (s <= t).
    With M that mask, G_t the log decay summed over M's row t and u_s token s's update (delta of the recurrence):
      (I + L) U = beta*(V - exp(G)*K S0),  L[t,s] = beta_t (k_t.k_s) exp(G_t - G_s) for s a strict ancestor of t
      O = exp(G)*Q S0 + ((Q K^T) o exp(G_t - G_s) o M) U
    Each token's row depends only on its ancestors' rows, so a tree costs what a chain of its size costs."""
    T, hv = v.shape[0], v.shape[1]
    qh = _tiled(q.float(), hv).transpose(0, 1)                             # [Hv, T, Dk]
    kh = _tiled(k.float(), hv).transpose(0, 1)
    vh = v.float().transpose(0, 1)                                         # [Hv, T, Dv]
    bh = beta.float().t()                                                  # [Hv, T]
    M = (ancestors.bool() if ancestors is not None
         else torch.ones(T, T, dtype=torch.bool, device=v.device).tril())
    G = g.float().t() @ M.float().t()                                      # [Hv, T]: sum over each row's ancestors
    decay = (G[:, :, None] - G[:, None, :]).masked_fill(~M, float("-inf")).exp()   # exp(G_t - G_s), s in M[t]
    eye = torch.eye(T, dtype=torch.bool, device=v.device)
    L = (bh[:, :, None] * (kh @ kh.transpose(-1, -2)) * decay).masked_fill(eye, 0.0)
    rhs = bh[:, :, None] * (vh - G.exp()[:, :, None] * (kh @ state))
    U = torch.linalg.solve_triangular(L + torch.eye(T, device=v.device), rhs, upper=False, unitriangular=True)
    o = G.exp()[:, :, None] * (qh @ state) + ((qh @ kh.transpose(-1, -2)) * decay) @ U
    return o.transpose(0, 1).contiguous()


# ---------------------------------------------------------------------------------------------------
# Triton recurrent kernel: one program per (value head, Dv block); the [Dk, BV] state tile stays in
# registers across the T tokens; reads and writes the state in place (CUDA-graph friendly).
# ---------------------------------------------------------------------------------------------------
if triton is not None:
    @triton.jit
    def _recurrent_inputs(q_ptr, k_ptr, v_ptr, g_ptr, b_ptr, parents_ptr, t, s_q, s_k, s_v, hk, h, offs_k, offs_v,
                          mask_v, HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, USE_PARENTS: tl.constexpr):
        """Token t's q, k, v (fp32), g, beta and parent (tree mode; else t - 1) for value head h / key head hk."""
        q = tl.load(q_ptr + t * s_q + hk * DK + offs_k).to(tl.float32)
        k = tl.load(k_ptr + t * s_k + hk * DK + offs_k).to(tl.float32)
        v = tl.load(v_ptr + t * s_v + h * DV + offs_v, mask=mask_v, other=0.0).to(tl.float32)
        g = tl.load(g_ptr + t * HV + h).to(tl.float32)
        beta = tl.load(b_ptr + t * HV + h).to(tl.float32)
        p = tl.load(parents_ptr + t) if USE_PARENTS else t - 1
        return q, k, v, g, beta, p

    @triton.jit
    def _recurrent_kernel(q_ptr, k_ptr, v_ptr, g_ptr, b_ptr, state_ptr, o_ptr, parents_ptr, states_ptr, T,
                          s_q, s_k, s_v, rk_ptr, rv_ptr, rg_ptr, rb_ptr,
                          HK: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr,
                          BV: tl.constexpr, USE_PARENTS: tl.constexpr, STORE_STATES: tl.constexpr,
                          STORE_FINAL: tl.constexpr, RECORD: tl.constexpr, PREFETCH: tl.constexpr,
                          PDL: tl.constexpr = False):
        """RECORD: also write each token's k, v, g, beta (fp32, contiguous) to rk / rv / rg / rb for the commit's
        replay (k by the first program of each key head, g and beta by each head's first value block).
        PREFETCH: token t + 1's inputs are loaded at the top of token t's step, so their memory latency overlaps
        that step's work (the T steps are a chain of dependent state updates; a token's loads do not depend on
        it, but read where they are used each would stall its step)."""
        pdl_enter(PDL)
        h = tl.program_id(0)
        vb = tl.program_id(1)
        hk = h % HK                                       # tiled value-head order
        offs_k = tl.arange(0, DK)
        offs_v = vb * BV + tl.arange(0, BV)
        mask_v = offs_v < DV
        mask_s = mask_v[None, :] & (offs_k[:, None] < DK)
        tile = offs_k[:, None] * DV + offs_v[None, :]     # [DK, BV] offsets inside one head's state
        head_off = h * DK * DV
        S = tl.load(state_ptr + head_off + tile, mask=mask_s, other=0.0)
        if PREFETCH:    # token t + 1's inputs are loaded while token t is computed
            qn, kn, vn, gn, bn, pn = _recurrent_inputs(q_ptr, k_ptr, v_ptr, g_ptr, b_ptr, parents_ptr, 0, s_q, s_k,
                                                       s_v, hk, h, offs_k, offs_v, mask_v, HV, DK, DV, USE_PARENTS)
        for t in range(T):
            if PREFETCH:
                q, k, v, g, beta, p = qn, kn, vn, gn, bn, pn
                qn, kn, vn, gn, bn, pn = _recurrent_inputs(q_ptr, k_ptr, v_ptr, g_ptr, b_ptr, parents_ptr,
                                                           tl.minimum(t + 1, T - 1), s_q, s_k, s_v, hk, h, offs_k,
                                                           offs_v, mask_v, HV, DK, DV, USE_PARENTS)
            else:
                q, k, v, g, beta, p = _recurrent_inputs(q_ptr, k_ptr, v_ptr, g_ptr, b_ptr, parents_ptr, t, s_q, s_k,
                                                        s_v, hk, h, offs_k, offs_v, mask_v, HV, DK, DV, USE_PARENTS)
            if USE_PARENTS:
                if p < 0:
                    S = tl.load(state_ptr + head_off + tile, mask=mask_s, other=0.0)
                elif p != t - 1:
                    S = tl.load(states_ptr + p.to(tl.int64) * (HV * DK * DV) + head_off + tile,
                                mask=mask_s, other=0.0)
            if RECORD:
                tl.store(rv_ptr + (t * HV + h) * DV + offs_v, v, mask=mask_v)
                if vb == 0:
                    tl.store(rg_ptr + t * HV + h, g)
                    tl.store(rb_ptr + t * HV + h, beta)
                    if h < HK:
                        tl.store(rk_ptr + (t * HK + h) * DK + offs_k, k)
            S = S * tl.exp(g)
            kv = tl.sum(S * k[:, None], axis=0)                              # S^T k  [BV]
            delta = beta * (v - kv)
            S = S + k[:, None] * delta[None, :]
            o = tl.sum(S * q[:, None], axis=0)
            tl.store(o_ptr + (t * HV + h) * DV + offs_v, o, mask=mask_v)
            if STORE_STATES:
                tl.store(states_ptr + t * (HV * DK * DV) + head_off + tile, S, mask=mask_s)
                if USE_PARENTS:
                    tl.debug_barrier()                    # a later token of this program may read it back
        if STORE_FINAL:
            tl.store(state_ptr + head_off + tile, S, mask=mask_s)


# ---------------------------------------------------------------------------------------------------
# Triton speculative-step kernel (`spec_chunk_ref` in one program per (value head, Dv block)): the T tokens'
# outputs from the committed state by matrix products, on a chain or a tree, with no per-token or per-node state.
# ---------------------------------------------------------------------------------------------------
if triton is not None:
    @triton.jit
    def _spec_chunk_kernel(q_ptr, k_ptr, v_ptr, g_ptr, b_ptr, state_ptr, o_ptr, anc_ptr, T, s_q, s_k, s_v, s_anc,
                           rk_ptr, rv_ptr, rg_ptr, rb_ptr,
                           HK: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr,
                           BV: tl.constexpr, BT: tl.constexpr, LOG_BT: tl.constexpr, KC: tl.constexpr,
                           TREE: tl.constexpr, RECORD: tl.constexpr, PREC_S: tl.constexpr, PREC_T: tl.constexpr,
                           TWO_LOOPS: tl.constexpr = True, PDL: tl.constexpr = False):
        """PREC_S / PREC_T: input precision of the products with the state / among the tokens (SPEC_CHUNK_PRECISION).
        (I + L)^-1 by block forward substitution: X starts as the inverse of the 1 x 1 diagonal blocks (I);
        level s turns the inverses of the 2^s blocks into those of the 2^(s+1) blocks,
        X <- X - X A X with A the lower-left 2^s quarter of each 2^(s+1) block of L (for [[A11, 0], [A21, A22]]
        the inverse is [[X1, 0], [-X2 A21 X1, X2]]). No power series: nothing grows and cancels."""
        pdl_enter(PDL)
        h = tl.program_id(0)
        vb = tl.program_id(1)
        hk = h % HK                                       # tiled value-head order
        t = tl.arange(0, BT)
        t_ok = t < T
        i = t[:, None]
        j = t[None, :]
        offs_v = vb * BV + tl.arange(0, BV)
        mask_v = offs_v < DV
        V = tl.load(v_ptr + i * s_v + h * DV + offs_v[None, :], mask=t_ok[:, None] & mask_v[None, :],
                    other=0.0).to(tl.float32)
        g = tl.load(g_ptr + t * HV + h, mask=t_ok, other=0.0).to(tl.float32)
        beta = tl.load(b_ptr + t * HV + h, mask=t_ok, other=0.0).to(tl.float32)
        if RECORD:
            tl.store(rv_ptr + (i * HV + h) * DV + offs_v[None, :], V, mask=t_ok[:, None] & mask_v[None, :])
            if vb == 0:
                tl.store(rg_ptr + t * HV + h, g, mask=t_ok)
                tl.store(rb_ptr + t * HV + h, beta, mask=t_ok)
        # the products over Dk in slices of KC columns: a whole [BT, Dk] operand in the MMA's register layout would
        # take 64 registers a thread per tf32 copy at Dk 128 (ptxas then spills)
        KS = tl.zeros((BT, BV), dtype=tl.float32)          # K S0
        QS = tl.zeros((BT, BV), dtype=tl.float32)          # Q S0
        KK = tl.zeros((BT, BT), dtype=tl.float32)          # K K^T
        QK = tl.zeros((BT, BT), dtype=tl.float32)          # Q K^T
        for c in range(0, DK, KC):
            offs_c = c + tl.arange(0, KC)
            Q = tl.load(q_ptr + i * s_q + hk * DK + offs_c[None, :], mask=t_ok[:, None], other=0.0).to(tl.float32)
            K = tl.load(k_ptr + i * s_k + hk * DK + offs_c[None, :], mask=t_ok[:, None], other=0.0).to(tl.float32)
            S0 = tl.load(state_ptr + h * DK * DV + offs_c[:, None] * DV + offs_v[None, :], mask=mask_v[None, :],
                         other=0.0)
            if RECORD:
                if (vb == 0) & (h < HK):
                    tl.store(rk_ptr + (i * HK + h) * DK + offs_c[None, :], K, mask=t_ok[:, None])
            KS = tl.dot(K, S0, KS, input_precision=PREC_S)
            QS = tl.dot(Q, S0, QS, input_precision=PREC_S)
            if not TWO_LOOPS:
                KK = tl.dot(K, tl.trans(K), KK, input_precision=PREC_T)
                QK = tl.dot(Q, tl.trans(K), QK, input_precision=PREC_T)
        if TWO_LOOPS:
            # the products among the tokens in a loop of their own (SPEC_CHUNK_TWO_LOOPS)
            for c in range(0, DK, KC):
                offs_c = c + tl.arange(0, KC)
                Q = tl.load(q_ptr + i * s_q + hk * DK + offs_c[None, :], mask=t_ok[:, None],
                            other=0.0).to(tl.float32)
                K = tl.load(k_ptr + i * s_k + hk * DK + offs_c[None, :], mask=t_ok[:, None],
                            other=0.0).to(tl.float32)
                KK = tl.dot(K, tl.trans(K), KK, input_precision=PREC_T)
                QK = tl.dot(Q, tl.trans(K), QK, input_precision=PREC_T)
        if TREE:
            M = tl.load(anc_ptr + i * s_anc + j, mask=(i < T) & (j < T), other=0) != 0
        else:
            M = (j <= i) & (i < T)
        G = tl.sum(tl.where(M, g[None, :], 0.0), axis=1)                      # log decay along each path
        decay = tl.where(M, tl.exp(tl.where(M, G[:, None] - G[None, :], 0.0)), 0.0)
        eg = tl.exp(G)[:, None]
        L = tl.where(j < i, KK * decay, 0.0) * beta[:, None]
        X = tl.where(i == j, 1.0, 0.0)
        for s in tl.static_range(LOG_BT):
            A = tl.where(((i >> (s + 1)) == (j >> (s + 1))) & ((i >> s) != (j >> s)), L, 0.0)
            X = X - tl.dot(tl.dot(X, A, input_precision=PREC_T), X, input_precision=PREC_T)
        U = tl.dot(X, beta[:, None] * (V - eg * KS), input_precision=PREC_T)
        O = eg * QS + tl.dot(QK * decay, U, input_precision=PREC_T)
        tl.store(o_ptr + (i * HV + h) * DV + offs_v[None, :], O, mask=t_ok[:, None] & mask_v[None, :])


def spec_chunk_triton(q, k, v, g, beta, state, ancestors=None, out=None, record=None) -> torch.Tensor:
    """The Triton speculative-step kernel (contract of `spec_chunk_ref`; T <= SPEC_CHUNK_MAX_T, Dk a power of 2).
    record: as `recurrent_triton`'s."""
    if triton is None:
        raise RuntimeError("the Triton speculative-step kernel needs `triton` installed")
    T, hk, dk = q.shape
    hv, dv = v.shape[1], v.shape[2]
    if T > SPEC_CHUNK_MAX_T:
        raise ValueError(f"{T} tokens: the speculative-step kernel takes at most {SPEC_CHUNK_MAX_T}")
    if dk & (dk - 1) or dk < 16:
        raise ValueError(f"key head dim {dk} must be a power of two >= 16 for the Triton kernel")
    if hv % hk:
        raise ValueError(f"value heads ({hv}) must be a multiple of key heads ({hk})")
    if state.dtype != torch.float32 or tuple(state.shape) != (hv, dk, dv) or not state.is_contiguous():
        raise ValueError(f"state must be contiguous fp32 [{hv}, {dk}, {dv}], got {tuple(state.shape)} {state.dtype}")
    if ancestors is not None and (tuple(ancestors.shape) != (T, T) or ancestors.stride(1) != 1):
        raise ValueError(f"ancestors must be [{T}, {T}] with unit column stride, got {tuple(ancestors.shape)}")
    q, k, v = (_token_rows(x) for x in (q, k, v))
    g, beta = g.float().contiguous(), beta.float().contiguous()
    o = out if out is not None else torch.empty(T, hv, dv, dtype=torch.float32, device=v.device)
    bt = max(16, triton.next_power_of_2(T))
    bv, warps = SPEC_CHUNK_TILE
    bv = max(16, min(bv, triton.next_power_of_2(dv)))
    if record is not None:
        _check_record(record, T, hk, dk, hv, dv)
    rk, rv, rg, rb = record if record is not None else (state,) * 4
    anc = ancestors if ancestors is not None else state
    _spec_chunk_kernel[(hv, triton.cdiv(dv, bv))](
        q, k, v, g, beta, state, o, anc, T, q.stride(0), k.stride(0), v.stride(0),
        ancestors.stride(0) if ancestors is not None else 0, rk, rv, rg, rb,
        HK=hk, HV=hv, DK=dk, DV=dv, BV=bv, BT=bt, LOG_BT=bt.bit_length() - 1, KC=min(dk, SPEC_CHUNK_KC),
        TREE=ancestors is not None,
        RECORD=record is not None, PREC_S=SPEC_CHUNK_PRECISION[0], PREC_T=SPEC_CHUNK_PRECISION[1],
        TWO_LOOPS=SPEC_CHUNK_TWO_LOOPS, num_warps=warps, **launch_options(q.device, _spec_chunk_kernel))
    return o


def _check_record(record, T, hk, dk, hv, dv):
    shapes = ((T, hk, dk), (T, hv, dv), (T, hv), (T, hv))
    for buf, shape in zip(record, shapes):
        if buf.dtype != torch.float32 or tuple(buf.shape) != shape or not buf.is_contiguous():
            raise ValueError(f"record buffers must be contiguous fp32 {shapes}, got {tuple(buf.shape)}")


def _token_rows(x: torch.Tensor) -> torch.Tensor:
    """x [T, heads, dim] with each token's heads packed (stride dim, 1); the token stride is free."""
    return x if x.stride(2) == 1 and x.stride(1) == x.shape[2] else x.contiguous()


def recurrent_triton(q, k, v, g, beta, state, parents=None, states=None, out=None,
                     update_state: bool = True, record=None) -> torch.Tensor:
    """The Triton kernel (same contract as `recurrent_ref`); Dk a power of 2. record: None or contiguous fp32
    buffers (k [T, Hk, Dk], v [T, Hv, Dv], g [T, Hv], beta [T, Hv]) that receive the inputs as read."""
    if triton is None:
        raise RuntimeError("the Triton recurrent gated-delta-rule kernel needs `triton` installed")
    T, hk, dk = q.shape
    hv, dv = v.shape[1], v.shape[2]
    if dk & (dk - 1):
        raise ValueError(f"key head dim {dk} must be a power of two for the Triton kernel")
    if hv % hk:
        raise ValueError(f"value heads ({hv}) must be a multiple of key heads ({hk})")
    if state.dtype != torch.float32 or tuple(state.shape) != (hv, dk, dv) or not state.is_contiguous():
        raise ValueError(f"state must be contiguous fp32 [{hv}, {dk}, {dv}], got {tuple(state.shape)} {state.dtype}")
    if parents is not None and states is None:
        raise ValueError("tree mode (parents) needs a `states` buffer [T, Hv, Dk, Dv] for the per-node states")
    if states is not None and (states.dtype != torch.float32 or tuple(states.shape[1:]) != (hv, dk, dv)
                               or states.shape[0] < T or not states.is_contiguous()):
        raise ValueError(f"states must be contiguous fp32 [>= {T}, {hv}, {dk}, {dv}], got {tuple(states.shape)}")
    q, k, v = (_token_rows(t) for t in (q, k, v))            # token rows may be strided (conv_qk's columns)
    g, beta = g.float().contiguous(), beta.float().contiguous()
    o = out if out is not None else torch.empty(T, hv, dv, dtype=torch.float32, device=v.device)
    bv = min(32, triton.next_power_of_2(dv))
    dummy = state                                         # any valid pointer for unused arguments
    if record is not None:
        _check_record(record, T, hk, dk, hv, dv)
    rk, rv, rg, rb = record if record is not None else (dummy,) * 4
    grid = (hv, triton.cdiv(dv, bv))
    _recurrent_kernel[grid](q, k, v, g, beta, state, o,
                            parents if parents is not None else dummy,
                            states if states is not None else dummy, T, q.stride(0), k.stride(0), v.stride(0),
                            rk, rv, rg, rb, HK=hk, HV=hv, DK=dk, DV=dv, BV=bv,
                            USE_PARENTS=parents is not None, STORE_STATES=states is not None,
                            STORE_FINAL=parents is None and update_state, RECORD=record is not None,
                            PREFETCH=RECURRENT_PREFETCH and T > 1, **launch_options(q.device, _recurrent_kernel))
    return o


# Timed and not kept (H100, 2026-12-05, `gpu_pending.sh part128` at 704c734): a decode step's recurrence and the
# layer's gated RMSNorm in one launch, one program a value head owning its whole [Dk, Dv] state (so that it could
# normalize its Dv outputs itself): the 27B AR step 6.842-6.846 -> 6.881-6.887 ms (16 warps: 6.996). 48 programs,
# each moving a 64 KiB state in and out on one SM, take longer than 192 programs of 16 KiB and the norm's launch.

# ---------------------------------------------------------------------------------------------------
# Commit of a speculative step: replay the accepted tokens' recorded inputs from the committed state.
# Recorded inputs of all L DeltaNet layers: k [L, M, Hk, Dk], v [L, M, Hv, Dv], g / beta [L, M, Hv]
# (M = scratch rows, step token t at row t); state [L, Hv, Dk, Dv] fp32, advanced in place.
# path [P] int64 step indices of the accepted tokens; only the first n are applied (n: int or a 0-dim
# device tensor, so a padded fixed-shape path can be captured in a CUDA graph).
# ---------------------------------------------------------------------------------------------------
def replay_ref(k, v, g, beta, state, path, n) -> None:
    """PyTorch replay (every layer at once, fixed shape over the P path entries: entries j >= n act as
    identity tokens, g = 0 and beta = 0, which leave S exactly unchanged)."""
    hv = state.shape[1]
    hk = k.shape[2]
    P = path.shape[0]
    kp = k.index_select(1, path).float().repeat(1, 1, hv // hk, 1)      # [L, P, Hv, Dk] tiled order
    vp = v.index_select(1, path).float()                                # [L, P, Hv, Dv]
    gp, bp = g.index_select(1, path).float(), beta.index_select(1, path).float()   # [L, P, Hv]
    if torch.is_tensor(n):
        valid = (torch.arange(P, device=path.device) < n).view(1, P, 1)   # [1, P, 1]
        gp, bp = gp * valid, bp * valid
        steps = P
    else:
        steps = min(int(n), P)
    for j in range(steps):
        state.mul_(gp[:, j].exp()[:, :, None, None])
        kv = torch.einsum("lhk,lhkv->lhv", kp[:, j], state)                # S^T k  [L, Hv, Dv]
        delta = bp[:, j, :, None] * (vp[:, j] - kv)
        state.add_(kp[:, j, :, :, None] * delta[:, :, None, :])


if triton is not None:
    @triton.jit
    def _replay_kernel(k_ptr, v_ptr, g_ptr, b_ptr, state_ptr, path_ptr, n_ptr, n_host, M,
                       HK: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr,
                       BV: tl.constexpr, N_ON_DEVICE: tl.constexpr, PDL: tl.constexpr = False):
        pdl_enter(PDL)
        pid = tl.program_id(0)                            # over L * HV
        vb = tl.program_id(1)
        layer = (pid // HV).to(tl.int64)
        h = pid % HV
        hk = h % HK                                       # tiled value-head order
        offs_k = tl.arange(0, DK)
        offs_v = vb * BV + tl.arange(0, BV)
        mask_v = offs_v < DV
        mask_s = mask_v[None, :] & (offs_k[:, None] < DK)
        tile = offs_k[:, None] * DV + offs_v[None, :]
        s_off = (layer * HV + h) * (DK * DV)
        S = tl.load(state_ptr + s_off + tile, mask=mask_s, other=0.0)
        if N_ON_DEVICE:
            n = tl.load(n_ptr).to(tl.int32)
        else:
            n = n_host
        for j in range(n):
            row = layer * M + tl.load(path_ptr + j).to(tl.int64)             # recorded row of this token
            k = tl.load(k_ptr + (row * HK + hk) * DK + offs_k).to(tl.float32)
            v = tl.load(v_ptr + (row * HV + h) * DV + offs_v, mask=mask_v, other=0.0).to(tl.float32)
            g = tl.load(g_ptr + row * HV + h).to(tl.float32)
            beta = tl.load(b_ptr + row * HV + h).to(tl.float32)
            S = S * tl.exp(g)
            kv = tl.sum(S * k[:, None], axis=0)
            S = S + k[:, None] * (beta * (v - kv))[None, :]
        tl.store(state_ptr + s_off + tile, S, mask=mask_s)


def replay_triton(k, v, g, beta, state, path, n) -> None:
    """The Triton replay: one launch for all layers; with n a device tensor it is CUDA-graph capturable."""
    if triton is None:
        raise RuntimeError("the Triton replay kernel needs `triton` installed")
    L, hv, dk, dv = state.shape
    M, hk = k.shape[1], k.shape[2]
    if dk & (dk - 1):
        raise ValueError(f"key head dim {dk} must be a power of two for the Triton kernel")
    if state.dtype != torch.float32 or not state.is_contiguous():
        raise ValueError("state must be contiguous fp32 [L, Hv, Dk, Dv]")
    for name, t, shape in (("k", k, (L, M, hk, dk)), ("v", v, (L, M, hv, dv)), ("g", g, (L, M, hv)),
                           ("beta", beta, (L, M, hv))):
        if tuple(t.shape) != shape or not t.is_contiguous():
            raise ValueError(f"recorded {name} must be contiguous {shape}, got {tuple(t.shape)}")
    on_device = torch.is_tensor(n)
    bv = min(32, triton.next_power_of_2(dv))
    _replay_kernel[(L * hv, triton.cdiv(dv, bv))](
        k, v, g, beta, state, path, n if on_device else path, 0 if on_device else min(int(n), path.shape[0]), M,
        HK=hk, HV=hv, DK=dk, DV=dv, BV=bv, N_ON_DEVICE=on_device, **launch_options(k.device, _replay_kernel))


def replay(k, v, g, beta, state, path, n) -> None:
    """Advance `state` along the first n tokens of `path` (Triton on CUDA, PyTorch elsewhere)."""
    if state.is_cuda and triton is not None:
        replay_triton(k, v, g, beta, state, path, n)
    else:
        replay_ref(k, v, g, beta, state, path, n)


# ---------------------------------------------------------------------------------------------------
# Dispatch
# ---------------------------------------------------------------------------------------------------
def _fla_prefill(q, k, v, g, beta, state, update_state: bool = True) -> torch.Tensor:
    """flash-linear-attention's chunked kernel (bf16 inputs, fp32 state). q/k are expanded to the value
    heads in tiled order so the call works whatever GVA head order the installed fla version assumes."""
    hv = v.shape[1]
    qh = _tiled(q, hv).to(torch.bfloat16).unsqueeze(0)                     # [1, T, Hv, Dk]
    kh = _tiled(k, hv).to(torch.bfloat16).unsqueeze(0)
    o, final = _fla_chunk(qh, kh, v.to(torch.bfloat16).unsqueeze(0), g.float().unsqueeze(0),
                          beta.to(torch.bfloat16).unsqueeze(0), scale=1.0,
                          initial_state=state.unsqueeze(0), output_final_state=update_state,
                          use_qk_l2norm_in_kernel=False)
    if update_state:
        state.copy_(final.squeeze(0))
    return o.squeeze(0).float()


def _use_triton(x: torch.Tensor) -> bool:
    """Whether `gated_delta_rule` runs the Triton kernels for x (the tests force it to run them on the CPU)."""
    return x.is_cuda and triton is not None


def gated_delta_rule(q, k, v, g, beta, state, chunk: int = 64, parents=None, states=None,
                     update_state: bool = True, record=None, ancestors=None) -> torch.Tensor:
    """Pick the implementation for this device and length (a Python decision: CUDA-graph safe).

    update_state=False computes the outputs without writing the final state back (speculative steps); on CUDA
    they run `spec_chunk_triton` (SPEC_CHUNK), a tree given by its `ancestors` mask [T, T]. Otherwise parents
    (tree verification) runs the recurrent kernel (the Triton one needs `states`). record: buffers (k, v, g,
    beta) that receive the inputs of a speculative step (written by the Triton kernel as it reads them, else
    copied)."""
    T = q.shape[0]
    kernels = _use_triton(q)
    if kernels and _spec_chunk(T) and not update_state and (parents is None or ancestors is not None):
        return spec_chunk_triton(q, k, v, g, beta, state, ancestors=ancestors, record=record)
    if kernels and (parents is not None or T <= RECURRENT_MAX_T):
        return recurrent_triton(q, k, v, g, beta, state, parents=parents, states=states,
                                update_state=update_state, record=record)
    if record is not None:
        for buf, x in zip(record, (k, v, g, beta)):
            buf.copy_(x)
    if parents is not None:
        return recurrent_ref(q, k, v, g, beta, state, parents=parents, states=states)
    if q.is_cuda:
        if _fla_chunk is not None:
            return _fla_prefill(q, k, v, g, beta, state, update_state)
    if T == 1:
        return recurrent_ref(q, k, v, g, beta, state, update_state=update_state)
    return chunked_ref(q, k, v, g, beta, state, chunk, update_state)


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """x / sqrt(sum(x^2) + eps) over the last dim, fp32 (the form HF and fla use)."""
    x = x.float()
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def causal_conv(x: torch.Tensor, window: torch.Tensor, weight: torch.Tensor, update: bool = True) -> torch.Tensor:
    """Depthwise causal conv over [window; x] with the carried window, then SiLU; updates `window` in place
    (unless update=False: speculative chains).

    x: [T, C] raw projections of this step; window: [K-1, C] the previous K-1 raw vectors (zeros at the
    start of a sequence); weight: [C, K] (GGUF `ssm_conv1d`, weight[:, K-1] multiplies the current token).
    Returns [T, C] fp32.
    """
    K = weight.shape[1]
    full = torch.cat([window.float(), x.float()], dim=0)                  # [K-1+T, C]
    if update:
        window.copy_(full[full.shape[0] - (K - 1):])
    cols = full.unfold(0, K, 1)                                            # [T, C, K]
    return F.silu((cols * weight.float()).sum(-1))


if triton is not None:

    @triton.jit
    def _conv_qk_kernel(x_ptr, win_ptr, w_ptr, out_ptr, T, C, s_x, QK, scale, eps,
                        a_ptr, b_ptr, A_ptr, dt_ptr, gb_ptr, HV, s_a, s_b, rec_ptr, idx_ptr,
                        KW: tl.constexpr, BLOCK: tl.constexpr, SHIFT_WINDOW: tl.constexpr, GATE: tl.constexpr = False,
                        BLOCK_HV: tl.constexpr = 1, RECORD: tl.constexpr = False, TREE: tl.constexpr = False,
                        PDL: tl.constexpr = False):
        """One (token t, channel block) program: depthwise causal conv over [window; x] (KW taps), SiLU, and
        for the q / k channels (c < QK; blocks are whole heads) the l2 norm of the head, q also scaled.
        SHIFT_WINDOW (one token: this program is the only reader of its channels' window): the window moves
        on by the token in place, each row written after it was read.
        GATE: one more program per token (channel block C / BLOCK) writes the token's g and beta to gb (2, T, HV),
        as _gate_beta_kernel does (one launch fewer a DeltaNet layer). RECORD: each program also copies its channels
        of the token's own x row to rec (T, C) fp32, the raw rows a speculative step keeps for its commit.
        TREE: tap j of token t reads row idx[t, j] of [window; x] (tree_conv_index: the node's ancestors) instead of
        row t + j."""
        pdl_enter(PDL)
        t = tl.program_id(0)
        if GATE:
            if tl.program_id(1) * BLOCK >= C:
                _gate_beta_row(a_ptr, b_ptr, A_ptr, dt_ptr, gb_ptr, t, T, HV, s_a, s_b, BLOCK_HV)
                return
        c = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        ok = c < C
        acc = tl.zeros([BLOCK], tl.float32)
        for j in tl.static_range(KW):                  # row t + j of [window (KW-1 rows); x]
            if TREE:                                   # row idx[t, j]: the window's or a step row's
                r = tl.load(idx_ptr + t * KW + j) + tl.zeros([BLOCK], tl.int64)     # per lane: masks of lanes
                in_win = r < KW - 1
                v = tl.where(in_win,
                             tl.load(win_ptr + tl.minimum(r, KW - 2) * C + c, mask=ok & in_win, other=0).to(tl.float32),
                             tl.load(x_ptr + tl.maximum(r - (KW - 1), 0) * s_x + c, mask=ok & (r >= KW - 1),
                                     other=0).to(tl.float32))
            else:
                r = t + j
                if r < KW - 1:
                    v = tl.load(win_ptr + r * C + c, mask=ok, other=0).to(tl.float32)
                else:
                    v = tl.load(x_ptr + (r - (KW - 1)).to(tl.int64) * s_x + c, mask=ok, other=0).to(tl.float32)
            if SHIFT_WINDOW and j >= 1:                # new window row j - 1 = old row j (the token for the last)
                tl.store(win_ptr + (j - 1) * C + c, v, mask=ok)
            if RECORD and j == KW - 1:                 # row t of x
                tl.store(rec_ptr + t.to(tl.int64) * C + c, v, mask=ok)
            acc += v * tl.load(w_ptr + c * KW + j, mask=ok, other=0).to(tl.float32)
        y = acc / (1.0 + tl.exp(-acc))                 # SiLU
        if tl.program_id(1) * BLOCK < QK:              # a q or k head: x / sqrt(sum x^2 + eps)
            y = y * (1.0 / tl.sqrt_rn(tl.sum(y * y, axis=0) + eps))
            if tl.program_id(1) * BLOCK < QK // 2:
                y = y * scale
        tl.store(out_ptr + t.to(tl.int64) * C + c, y, mask=ok)


def use_fused_conv(x: torch.Tensor) -> bool:
    """conv_qk runs on CUDA outside autograd (tests patch this to run it in the interpreter on the CPU)."""
    return triton is not None and x.is_cuda and not (torch.is_grad_enabled() and x.requires_grad)


# DFLASH24_FUSED_GATE=0: the DeltaNet g / beta in their own kernel (gate_beta) rather than inside conv_qk's launch.
FUSED_GATE = os.environ.get("DFLASH24_FUSED_GATE", "1") != "0"
# DFLASH24_FUSED_TREE_CONV=0: a tree step's conv, norms and gate by the PyTorch path (tree_conv, l2norm, gate_beta)
# rather than conv_qk(index=...).
FUSED_TREE_CONV = os.environ.get("DFLASH24_FUSED_TREE_CONV", "1") != "0"


def conv_qk(x: torch.Tensor, window: torch.Tensor, weight: torch.Tensor, k_heads: int, k_dim: int,
            update: bool = True, gate: tuple | None = None, record: torch.Tensor | None = None,
            index: torch.Tensor | None = None):
    """causal_conv + l2norm of the q and k heads (q times k_dim^-0.5) in one Triton kernel: [T, C] fp32 with
    channels [q | k | v], the same values as the PyTorch path of the qwen35 layer up to fp32 rounding. Updates
    the window like causal_conv (one token: inside the kernel; more: in a second, tiny copy). None when the
    shapes do not fit the kernel (head dim not a power of two, or v channels not a multiple of it): the
    caller takes the reference path.
    x may be a column slice of a wider matrix (rows strided, channels contiguous).
    gate: (alpha, b, ssm_a, ssm_dt) as gate_beta takes them: the same launch also computes (g, beta), and the
    result is (out, g, beta), with g and beta None when their layout does not fit (the caller runs gate_beta).
    record: a contiguous fp32 [T, C] buffer that receives x as the kernel reads it (a speculative step's raw rows,
    `HybridCache.raw_rows`), in place of a copy.
    index: a tree step's conv rows (tree_conv_index, [T, K] int64): each node's conv runs along its ancestors, as
    tree_conv does; the window is left as it is (update must be False). None with FUSED_TREE_CONV off."""
    T, C = x.shape
    K = weight.shape[1]
    qk = 2 * k_heads * k_dim
    if (triton is None or k_dim & (k_dim - 1) or (C - qk) % k_dim or tuple(window.shape) != (K - 1, C)
            or not (x.stride(1) == 1 and window.is_contiguous() and weight.is_contiguous())
            or (index is not None and not FUSED_TREE_CONV)):
        return None
    if record is not None and (record.dtype != torch.float32 or tuple(record.shape) != (T, C)
                               or not record.is_contiguous()):
        raise ValueError(f"conv_qk record must be contiguous fp32 {(T, C)}, got {tuple(record.shape)} {record.dtype}")
    if index is not None and (update or index.dtype != torch.int64 or tuple(index.shape) != (T, K)
                              or not index.is_contiguous()):
        raise ValueError(f"conv_qk index must be contiguous int64 {(T, K)} with update=False, got "
                         f"{tuple(index.shape)} {index.dtype} update={update}")
    out = torch.empty(T, C, device=x.device, dtype=torch.float32)
    shift = update and T == 1 and K > 1
    fuse = gate is not None and FUSED_GATE and _gate_beta_fits(*gate)
    if fuse:
        alpha, b, ssm_a, ssm_dt = gate
        hv = alpha.shape[1]
        gb = torch.empty(2, T, hv, device=x.device, dtype=torch.float32)
        gate_args = (alpha, b, ssm_a, ssm_dt, gb, hv, alpha.stride(0), b.stride(0))
    else:
        gate_args = (out, out, out, out, out, 0, 0, 0)
    _conv_qk_kernel[(T, C // k_dim + fuse)](x, window, weight, out, T, C, x.stride(0), qk, k_dim ** -0.5, 1e-6,
                                            *gate_args, record if record is not None else out,
                                            index if index is not None else out, KW=K, BLOCK=k_dim,
                                            SHIFT_WINDOW=shift, GATE=fuse,
                                            BLOCK_HV=triton.next_power_of_2(gate_args[5]) if fuse else 1,
                                            RECORD=record is not None, TREE=index is not None,
                                            num_warps=4 if k_dim >= 128 else 1,
                                            **launch_options(x.device, _conv_qk_kernel))
    if update and not shift:
        if T >= K - 1:
            window.copy_(x[T - (K - 1):])
        else:
            window.copy_(torch.cat([window[T:], x.to(window.dtype)], dim=0))
    if gate is None:
        return out
    return (out, gb[0], gb[1]) if fuse else (out, None, None)


# ---------------------------------------------------------------------------------------------------
# The recurrence's per-token scalars from the layer's projections: log decay g = A * softplus(alpha + dt)
# (A = ssm_a < 0) and beta = sigmoid(b), in one kernel on CUDA instead of ~9 elementwise PyTorch kernels.
# ---------------------------------------------------------------------------------------------------
def softplus(x: torch.Tensor) -> torch.Tensor:
    """log(1 + e^x) (x above 20: x, as torch's): from exp and log1p, whose results do not depend on where a
    value sits in the tensor -- the CPU's own softplus rounds its vectorized body and its scalar tail
    differently, which would make a token's decay depend on how many tokens share its step."""
    return torch.where(x > 20, x, torch.log1p(torch.exp(x)))


def gate_beta_ref(alpha: torch.Tensor, b: torch.Tensor, ssm_a: torch.Tensor, ssm_dt: torch.Tensor):
    """(g, beta), both fp32 [T, Hv]: the reference of gate_beta."""
    return ssm_a * softplus(alpha.float() + ssm_dt), torch.sigmoid(b.float())


if triton is not None:

    @triton.jit
    def _gate_beta_kernel(a_ptr, b_ptr, A_ptr, dt_ptr, out_ptr, T, HV, s_a, s_b, BLOCK: tl.constexpr,
                          PDL: tl.constexpr = False):
        """Row t: out[0, t] = A * softplus(alpha_t + dt), out[1, t] = sigmoid(b_t), fp32."""
        pdl_enter(PDL)
        _gate_beta_row(a_ptr, b_ptr, A_ptr, dt_ptr, out_ptr, tl.program_id(0), T, HV, s_a, s_b, BLOCK)

    @triton.jit
    def _gate_beta_row(a_ptr, b_ptr, A_ptr, dt_ptr, out_ptr, t, T, HV, s_a, s_b, BLOCK: tl.constexpr):
        h = tl.arange(0, BLOCK)
        ok = h < HV
        x = (tl.load(a_ptr + t * s_a + h, mask=ok, other=0).to(tl.float32)
             + tl.load(dt_ptr + h, mask=ok, other=0).to(tl.float32))
        sp = tl.where(x > 20.0, x, tl.maximum(x, 0.0) + tl.log(1.0 + tl.exp(-tl.abs(x))))
        g = tl.load(A_ptr + h, mask=ok, other=0).to(tl.float32) * sp
        bv = tl.load(b_ptr + t * s_b + h, mask=ok, other=0).to(tl.float32)
        tl.store(out_ptr + t * HV + h, g, mask=ok)
        tl.store(out_ptr + (T + t) * HV + h, 1.0 / (1.0 + tl.exp(-bv)), mask=ok)


def _gate_beta_fits(alpha: torch.Tensor, b: torch.Tensor, ssm_a: torch.Tensor, ssm_dt: torch.Tensor) -> bool:
    """Whether the Triton g / beta code takes these (rows may be strided, values contiguous)."""
    return (triton is not None and alpha.dim() == 2 and b.shape == alpha.shape and alpha.stride(1) == 1
            and b.stride(1) == 1 and ssm_a.is_contiguous() and ssm_dt.is_contiguous()
            and ssm_a.numel() == alpha.shape[1] and ssm_dt.numel() == alpha.shape[1])


def gate_beta(alpha: torch.Tensor, b: torch.Tensor, ssm_a: torch.Tensor, ssm_dt: torch.Tensor, fused: bool):
    """(g, beta) fp32 [T, Hv] from the projections alpha, b [T, Hv] (rows may be strided: column slices of
    the fused input projection). fused (the caller's use_fused_conv): one Triton kernel, the same values as
    gate_beta_ref to fp32 rounding (softplus as max(x, 0) + log(1 + e^-|x|)); else the reference."""
    T, hv = alpha.shape
    if not (fused and _gate_beta_fits(alpha, b, ssm_a, ssm_dt)):
        return gate_beta_ref(alpha, b, ssm_a, ssm_dt)
    out = torch.empty(2, T, hv, device=alpha.device, dtype=torch.float32)
    _gate_beta_kernel[(T,)](alpha, b, ssm_a, ssm_dt, out, T, hv, alpha.stride(0), b.stride(0),
                            BLOCK=triton.next_power_of_2(hv), num_warps=1,
                            **launch_options(alpha.device, _gate_beta_kernel))
    return out[0], out[1]


# A tree step's conv rows from one launch (False: the tensor ops of the reference; benchmarks/ab_steps.py's A/B).
TREE_INDEX_KERNEL = True

if triton is not None:

    @triton.jit
    def _tree_conv_index_kernel(par_ptr, out_ptr, T, K: tl.constexpr, BLOCK_T: tl.constexpr, PDL: tl.constexpr = False):
        """tree_conv_index in one program (its reference below, step for step): column K-1 each node's own row of
        [window; x], each column before it the row one step up the node's ancestor chain."""
        pdl_enter(PDL)
        W: tl.constexpr = K - 1
        t = tl.arange(0, BLOCK_T)
        ok = t < T
        cur = W + t.to(tl.int64)
        tl.store(out_ptr + t * K + W, cur, mask=ok)
        for j in tl.static_range(1, K):
            p = tl.load(par_ptr + tl.maximum(cur - W, 0), mask=ok, other=-1).to(tl.int64)   # the parent of `cur`
            up = tl.where(p >= 0, p + W, W - 1)                     # its row, or the committed window's last
            cur = tl.where(cur >= W, up, cur - 1)                   # inside the window: one row back
            tl.store(out_ptr + t * K + (W - j), cur, mask=ok)


def tree_conv_index_triton(parents: torch.Tensor, K: int) -> torch.Tensor:
    """tree_conv_index as one kernel launch (instead of about 30 small tensor ops in a tree verify step)."""
    T = parents.shape[0]
    out = torch.empty(T, K, dtype=torch.int64, device=parents.device)
    if T:
        _tree_conv_index_kernel[(1,)](parents, out, T, K=K, BLOCK_T=triton.next_power_of_2(T), num_warps=1,
                                      **launch_options(parents.device, _tree_conv_index_kernel))
    return out


def tree_conv_index(parents: torch.Tensor, K: int) -> torch.Tensor:
    """Rows of [window (K-1 rows); x (T rows)] that form each tree node's conv input: [T, K] int64.

    Column K-1 is the node itself, column K-2 its parent, ... ; past the committed root the chain continues
    into the committed window (its last row first). Fixed shape, no host sync (CUDA-graph safe). On CUDA one
    Triton launch (`tree_conv_index_triton`); the code below is its reference.
    """
    if TREE_INDEX_KERNEL and parents.is_cuda and triton is not None and parents.dim() == 1 and parents.is_contiguous():
        return tree_conv_index_triton(parents, K)
    W = K - 1
    par = parents.long()
    cur = W + torch.arange(par.shape[0], device=par.device)                # [T]: the node itself
    cols = [cur]
    for _ in range(W):
        is_node = cur >= W
        p = par[(cur - W).clamp(min=0)]                                    # parent of the node at `cur`
        up = torch.where(p >= 0, p + W, torch.full_like(p, W - 1))         # parent row, or the window's last
        cur = torch.where(is_node, up, cur - 1)                            # inside the window: one row back
        cols.append(cur)
    return torch.stack(cols[::-1], dim=1)                                  # [T, K]


def tree_conv(x: torch.Tensor, window: torch.Tensor, weight: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """causal_conv along each node's ancestor chain (`index` from tree_conv_index); `window` is not modified.
    x: [T, C]; window [K-1, C]; weight [C, K]; returns [T, C] fp32."""
    full = torch.cat([window.float(), x.float()], dim=0)                  # [K-1+T, C]
    cols = full[index].transpose(1, 2)                                     # [T, K, C] -> [T, C, K]
    return F.silu((cols * weight.float()).sum(-1))
