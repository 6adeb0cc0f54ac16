"""The DFlash training objective: a batched training forward of the drafter over many anchors of one
sequence, and the position-decayed loss (FACTS.md 3b; SpecForge `dflash` strategy, ModelOpt dflash.yaml).

Anchors a_1..a_N of one sequence ids [T] (target features F [T, n_capture*dim] from its own forward):
  block n = [ids[a_n], MASK x (B-1)] at positions a_n .. a_n+B-1, predicting ids[a_n+1 .. a_n+B-1];
  its queries see the fused context features of positions < a_n (exactly what `DFlashDrafter.draft` sees
  after `add_context` of the committed tokens 0..a_n-1) and the block's own keys (non-causal, or causal
  per layer as the config says; sliding windows as in `DFlashDrafter.visibility`).
All N blocks run in ONE forward: queries [N*B], keys [T context rows; N*B block rows], with a
visibility mask [N*B, T + N*B] (block rows of other anchors are hidden).

The trainable weights live in `DraftParams` under z-lab's safetensors names; the forward reuses the
engine's building blocks (rms_norm, Rotary, swiglu), so the logits of one anchor equal `draft()`'s.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..models.drafter import DFlashConfig, random_state_dict, tensor_shapes
from ..models.layers import Rotary, rms_norm


def _key(name: str) -> str:          # ParameterDict keys cannot hold dots
    return name.replace(".", "__")


class DraftParams(torch.nn.Module):
    """The drafter's trainable tensors by z-lab name (`fc.weight`, `layers.0.self_attn.q_proj.weight`...)."""

    def __init__(self, cfg: DFlashConfig, sd: dict[str, torch.Tensor] | None = None, seed: int = 0):
        super().__init__()
        self.cfg = cfg
        shapes = tensor_shapes(cfg)
        if sd is None:
            sd = random_state_dict(cfg, seed=seed)
            for name, shape in shapes.items():          # norms start at exactly 1 (a plain RMSNorm)
                if len(shape) == 1:
                    sd[name] = torch.ones(shape)
        missing = sorted(set(shapes) - set(sd))
        extra = sorted(set(sd) - set(shapes))
        if missing or extra:
            raise ValueError(f"drafter state dict: missing {missing[:4]}, unexpected {extra[:4]}")
        for name, shape in shapes.items():
            if tuple(sd[name].shape) != tuple(shape):
                raise ValueError(f"drafter tensor {name}: shape {tuple(sd[name].shape)}, expected {shape}")
        self.p = torch.nn.ParameterDict({_key(k): torch.nn.Parameter(v.detach().float().clone())
                                         for k, v in sd.items()})
        self.rope = Rotary(cfg.head_dim, cfg.rope_theta, cfg.max_positions, True)

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.p[_key(name)]

    def export(self, dtype=torch.bfloat16) -> dict[str, torch.Tensor]:
        """z-lab state dict (contiguous CPU tensors) for model.safetensors / DFlashDrafter.from_state_dict."""
        return {k.replace("__", "."): v.detach().to("cpu", dtype).contiguous() for k, v in self.p.items()}


def anchor_mask(cfg: DFlashConfig, anchors: torch.Tensor, n_ctx: int, layer: int) -> torch.Tensor:
    """Visibility [N*B, n_ctx + N*B] bool for one layer kind: query (n, j) at position a_n + j sees
    context row r iff r < a_n (and inside the window), and block key (m, i) iff m == n (and i <= j when
    the layer is causal; inside the window)."""
    B, N = cfg.block_size, anchors.shape[0]
    dev = anchors.device
    j = torch.arange(B, device=dev)
    qpos = (anchors[:, None] + j[None, :]).reshape(-1)                       # [N*B]
    qanc = anchors.repeat_interleave(B)                                      # [N*B]
    rows = torch.arange(n_ctx, device=dev)
    ctx = rows[None, :] < qanc[:, None]                                      # [N*B, T]
    same = torch.eye(N, dtype=torch.bool, device=dev).repeat_interleave(B, 0).repeat_interleave(B, 1)
    kpos = qpos                                                              # block keys sit at the same positions
    blk = same
    causal, window = cfg.causal[layer], cfg.window(layer)
    if causal:
        blk = blk & (kpos[None, :] <= qpos[:, None])
    if window is not None:
        ctx = ctx & (qpos[:, None] - rows[None, :] < window)
        d = qpos[:, None] - kpos[None, :]
        blk = blk & (d < window) & (causal | (-d < window))
    return torch.cat([ctx, blk], dim=1)


def train_forward(params: DraftParams, features: torch.Tensor, ids: torch.Tensor, anchors: torch.Tensor,
                  embed, lm_head_weight: torch.Tensor, n_ctx: int | None = None) -> torch.Tensor:
    """Drafter logits [N, B-1, vocab] (fp32) for block positions 1..B-1 of every anchor.

    features: [T, n_capture*dim] target features of positions 0..T-1 (only rows < max(anchor) are read);
    ids: [T] token ids (ids[a] is each block's first token); anchors: [N] int64 positions;
    embed(ids) -> [n, dim] the target's (frozen) embedding; lm_head_weight: [vocab, dim] dense, frozen.
    n_ctx: max(anchors) when the caller knows it on the host (saves a device -> host sync).
    """
    cfg, p = params.cfg, params
    B, N = cfg.block_size, anchors.shape[0]
    H, Hk, D = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    T = n_ctx if n_ctx is not None else (int(anchors.max()) if N else 0)    # context rows anyone reads
    dev = features.device
    ctx_pos = torch.arange(T, device=dev)
    blk_pos = (anchors[:, None] + torch.arange(B, device=dev)[None, :]).reshape(-1)   # [N*B]
    h_ctx = rms_norm(F.linear(features[:T].to(p["fc.weight"].dtype), p["fc.weight"]), p["hidden_norm.weight"],
                     cfg.norm_eps)                                           # [T, dim]
    blk_ids = torch.full((N, B), cfg.mask_token_id, dtype=torch.long, device=dev)
    blk_ids[:, 0] = ids[anchors]
    with torch.no_grad():
        x = embed(blk_ids.reshape(-1)).float()
    x = x.to(h_ctx.dtype)
    if cfg.embed_scale != 1.0:
        x = x * cfg.embed_scale
    masks: dict = {}
    for i in range(cfg.n_layers):
        kind = (cfg.causal[i], cfg.window(i))
        if kind not in masks:
            masks[kind] = anchor_mask(cfg, anchors, T, i)
        L = f"layers.{i}."

        def proj_kv(h, pos):
            k = F.linear(h, p[L + "self_attn.k_proj.weight"]).view(-1, Hk, D)
            k = rms_norm(k, p[L + "self_attn.k_norm.weight"], cfg.norm_eps)
            return params.rope(k, pos), F.linear(h, p[L + "self_attn.v_proj.weight"]).view(-1, Hk, D)

        kc, vc = proj_kv(h_ctx, ctx_pos)
        h = rms_norm(x, p[L + "input_layernorm.weight"], cfg.norm_eps)
        q = rms_norm(F.linear(h, p[L + "self_attn.q_proj.weight"]).view(-1, H, D),
                     p[L + "self_attn.q_norm.weight"], cfg.norm_eps)
        kb, vb = proj_kv(h, blk_pos)
        q = params.rope(q, blk_pos)
        k = torch.cat([kc, kb]).transpose(0, 1).unsqueeze(0)                 # [1, Hk, T+NB, D]
        v = torch.cat([vc, vb]).transpose(0, 1).unsqueeze(0)
        o = F.scaled_dot_product_attention(q.transpose(0, 1).unsqueeze(0), k, v, attn_mask=masks[kind],
                                           scale=D ** -0.5, enable_gqa=H != Hk)
        x = x + F.linear(o.squeeze(0).transpose(0, 1).reshape(-1, H * D), p[L + "self_attn.o_proj.weight"])
        h = rms_norm(x, p[L + "post_attention_layernorm.weight"], cfg.norm_eps)
        x = x + F.linear(F.silu(F.linear(h, p[L + "mlp.gate_proj.weight"])) * F.linear(h, p[L + "mlp.up_proj.weight"]),
                         p[L + "mlp.down_proj.weight"])
    x = x.view(N, B, -1)[:, 1:]
    logits = F.linear(rms_norm(x, p["norm.weight"], cfg.norm_eps), lm_head_weight.to(x.dtype)).float()
    if cfg.logit_scale != 1.0:
        logits = logits * cfg.logit_scale
    if cfg.logit_softcap is not None:
        logits = torch.tanh(logits / cfg.logit_softcap) * cfg.logit_softcap
    return logits


def position_weights(block_size: int, gamma: float | None, device=None) -> torch.Tensor:
    """[B-1] weights exp(-(k-1)/gamma) for block positions k = 1..B-1 (all 1 when gamma is None/0)."""
    k = torch.arange(1, block_size, device=device, dtype=torch.float32)
    return torch.ones_like(k) if not gamma else torch.exp(-(k - 1) / gamma)


def block_loss(logits: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor,
               target_logits: torch.Tensor | None = None, kl_weight: float = 0.0) -> tuple[torch.Tensor, dict]:
    """logits [N, B-1, V]; labels [N, B-1] (-100 = no label: past the sequence end);
    target_logits [N, B-1, V] (optional): the target's own next-token logits at those positions, for a
    forward-KL term KL(target || draft) weighted by kl_weight. Returns (loss, stats): loss = weighted mean
    of CE (+ KL) over labelled positions; stats (tensors on the logits' device): per-position top-1 accuracy
    acc_pos and label counts n_pos ([B-1]), mean accepted prefix (0-dim)."""
    valid = labels >= 0
    w = weights[None, :].expand_as(labels) * valid
    logp = torch.log_softmax(logits.float(), dim=-1)
    ce = -logp.gather(-1, labels.clamp(min=0).unsqueeze(-1)).squeeze(-1)     # [N, B-1]
    per = ce
    if target_logits is not None and kl_weight > 0:
        tp = torch.log_softmax(target_logits.float(), dim=-1)
        kl = (tp.exp() * (tp - logp)).sum(-1)
        per = ce + kl_weight * kl
    denom = w.sum().clamp(min=1e-8)
    loss = (per * w).sum() / denom
    with torch.no_grad():
        correct = (logits.argmax(-1) == labels) & valid
        n_pos = valid.sum(0)
        acc_pos = correct.sum(0).float() / n_pos.clamp(min=1)
        prefix = torch.cumprod(correct.int(), dim=1).sum(1).float()         # accepted drafts per block
        stats = {"acc_pos": acc_pos, "n_pos": n_pos,                                     # device tensors: no sync
                 "accepted": prefix.mean() if prefix.numel() else torch.zeros((), device=logits.device)}
    return loss, stats


def expected_acceptance(acc_pos: list[float]) -> float:
    """AL estimate from per-position accuracies: 1 (the bonus token) + sum_k prod_{i<=k} acc_i."""
    al, run = 1.0, 1.0
    for a in acc_pos:
        run *= a
        al += run
    return al


def default_anchor_count(n_candidates: int, seq_len: int, anchors: int, max_len: int) -> int:
    """`anchors` for a max_len sequence (512 per 2K as published), scaled by seq_len / max_len, at least 1,
    at most the candidate positions."""
    if n_candidates <= 0:
        return 0
    n = math.ceil(anchors * seq_len / max(max_len, 1))
    return max(1, min(n, anchors, n_candidates))
