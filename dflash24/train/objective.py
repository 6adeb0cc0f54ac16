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

import contextlib
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
    """Drafter logits [N, B-1, vocab] (fp32) for block positions 1..B-1 of every anchor of one sequence.

    features: [T, n_capture*dim] target features of positions 0..T-1 (only rows < max(anchor) are read);
    ids: [T] token ids (ids[a] is each block's first token); anchors: [N] int64 positions;
    embed(ids) -> [n, dim] the target's (frozen) embedding; lm_head_weight: [vocab, dim] dense, frozen.
    n_ctx: max(anchors) when the caller knows it on the host (saves a device -> host sync).
    """
    N = anchors.shape[0]
    n_ctx = n_ctx if n_ctx is not None else (int(anchors.max()) if N else 0)
    return train_forward_batch(params, [features], [ids], [anchors], embed, lm_head_weight, [n_ctx])[0, :N]


def train_forward_batch(params: DraftParams, features: list[torch.Tensor], ids: list[torch.Tensor],
                        anchors: list[torch.Tensor], embed, lm_head_weight: torch.Tensor,
                        n_ctx: list[int]) -> torch.Tensor:
    """`train_forward` of S sequences in one forward: logits [S, Nmax, B-1, vocab] (fp32), the anchors of a
    shorter list padded at the end (their rows are garbage: give them no label). Sequence s reads context rows
    < n_ctx[s] (its largest anchor); the context is padded to the longest, and every block sees only its own
    sequence's rows (one mask per sequence), so the rows of sequence s equal `train_forward` of s alone.
    One forward for the whole batch instead of one per sequence: a step's kernel launches do not grow with S."""
    cfg, p = params.cfg, params
    S, B = len(features), cfg.block_size
    H, Hk, D = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    dev = features[0].device
    T = max(max(n_ctx), 1)                                                    # context rows anyone reads
    Nm = max(max(a.shape[0] for a in anchors), 1)
    W = p["fc.weight"]
    feats = torch.zeros(S, T, features[0].shape[-1], dtype=W.dtype, device=dev)
    anc = torch.zeros(S, Nm, dtype=torch.long, device=dev)                   # padding anchors sit at 0
    blk_ids = torch.full((S, Nm, B), cfg.mask_token_id, dtype=torch.long, device=dev)
    for s in range(S):
        feats[s, :n_ctx[s]] = features[s][:n_ctx[s]].to(W.dtype)
        n = anchors[s].shape[0]
        anc[s, :n] = anchors[s]
        blk_ids[s, :n, 0] = ids[s][anchors[s]]
    h_ctx = rms_norm(F.linear(feats, W), p["hidden_norm.weight"], cfg.norm_eps)      # [S, T, dim]
    ctx_pos = torch.arange(T, device=dev).repeat(S)                                  # [S*T]
    blk_pos = (anc[:, :, None] + torch.arange(B, device=dev)).reshape(-1)            # [S*Nm*B]
    with torch.no_grad():
        x = embed(blk_ids.reshape(-1)).float()
    x = x.to(h_ctx.dtype).view(S, Nm * B, -1)
    if cfg.embed_scale != 1.0:
        x = x * cfg.embed_scale
    masks: dict = {}
    for i in range(cfg.n_layers):
        kind = (cfg.causal[i], cfg.window(i))
        if kind not in masks:                                                # [S, 1, Nm*B, T + Nm*B]
            masks[kind] = torch.stack([anchor_mask(cfg, anc[s], T, i) for s in range(S)]).unsqueeze(1)
        L = f"layers.{i}."

        def proj_kv(h, pos):                                                 # h [S, n, dim] -> [S, Hk, n, D]
            n = h.shape[1]
            k = F.linear(h, p[L + "self_attn.k_proj.weight"]).view(S * n, Hk, D)
            k = params.rope(rms_norm(k, p[L + "self_attn.k_norm.weight"], cfg.norm_eps), pos)
            v = F.linear(h, p[L + "self_attn.v_proj.weight"])
            return k.view(S, n, Hk, D).transpose(1, 2), v.view(S, n, Hk, D).transpose(1, 2)

        kc, vc = proj_kv(h_ctx, ctx_pos)
        h = rms_norm(x, p[L + "input_layernorm.weight"], cfg.norm_eps)
        q = rms_norm(F.linear(h, p[L + "self_attn.q_proj.weight"]).view(S * Nm * B, H, D),
                     p[L + "self_attn.q_norm.weight"], cfg.norm_eps)
        q = params.rope(q, blk_pos).view(S, Nm * B, H, D).transpose(1, 2)   # [S, H, Nm*B, D]
        kb, vb = proj_kv(h, blk_pos)
        # the KV heads repeated for their query groups (the memory-efficient kernel has no GQA)
        k = torch.cat([kc, kb], dim=2).repeat_interleave(H // Hk, dim=1)     # [S, H, T + Nm*B, D]
        v = torch.cat([vc, vb], dim=2).repeat_interleave(H // Hk, dim=1)
        with _attention_backends(dev):
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=masks[kind], scale=D ** -0.5)
        x = x + F.linear(o.transpose(1, 2).reshape(S, Nm * B, H * D), p[L + "self_attn.o_proj.weight"])
        h = rms_norm(x, p[L + "post_attention_layernorm.weight"], cfg.norm_eps)
        x = x + F.linear(F.silu(F.linear(h, p[L + "mlp.gate_proj.weight"])) * F.linear(h, p[L + "mlp.up_proj.weight"]),
                         p[L + "mlp.down_proj.weight"])
    x = x.view(S, Nm, B, -1)[:, :, 1:]
    logits = F.linear(rms_norm(x, p["norm.weight"], cfg.norm_eps), lm_head_weight.to(x.dtype)).float()
    if cfg.logit_scale != 1.0:
        logits = logits * cfg.logit_scale
    if cfg.logit_softcap is not None:
        logits = torch.tanh(logits / cfg.logit_softcap) * cfg.logit_softcap
    return logits


def _attention_backends(device: torch.device):
    """SDPA backends for the training forward. Its shapes change with every sequence, and on CUDA PyTorch
    picks cuDNN's attention, which builds a new graph per shape: ~20 ms of CPU per call, measured as 60 % of a
    training step on an H200 (benchmarks/profile_train.py). The memory-efficient kernel takes the same masks
    without a per-shape build."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    if device.type != "cuda":
        return contextlib.nullcontext()
    return sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])


def position_weights(block_size: int, gamma: float | None, device=None) -> torch.Tensor:
    """[B-1] weights exp(-(k-1)/gamma) for block positions k = 1..B-1 (all 1 when gamma is None/0)."""
    k = torch.arange(1, block_size, device=device, dtype=torch.float32)
    return torch.ones_like(k) if not gamma else torch.exp(-(k - 1) / gamma)


def block_loss(logits: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor,
               target_logits: torch.Tensor | None = None, kl_weight: float = 0.0,
               block_weight: torch.Tensor | None = None) -> tuple[torch.Tensor, dict]:
    """logits [N, B-1, V]; labels [N, B-1] (-100 = no label: past the sequence end);
    target_logits [N, B-1, V] (optional): the target's own next-token logits at those positions, for a
    forward-KL term KL(target || draft) weighted by kl_weight. Returns (loss, stats): loss = weighted mean
    of CE (+ KL) over labelled positions (with block_weight [N]: sum of CE x position weight x block_weight,
    for callers that normalise groups of blocks themselves); stats (tensors on the logits' device): per-position top-1 accuracy
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
    if block_weight is None:
        loss = (per * w).sum() / w.sum().clamp(min=1e-8)
    else:
        loss = (per * w * block_weight[:, None]).sum()
    with torch.no_grad():
        correct = (logits.argmax(-1) == labels) & valid
        n_pos = valid.sum(0)
        acc_pos = correct.sum(0).float() / n_pos.clamp(min=1)
        prefix = torch.cumprod(correct.int(), dim=1).sum(1).float()         # accepted drafts per block
        has = valid[:, 0].float() if valid.numel() else valid.new_zeros(0).float()   # blocks with labels
        stats = {"acc_pos": acc_pos, "n_pos": n_pos,                                     # device tensors: no sync
                 "accepted": (prefix * has).sum() / has.sum().clamp(min=1)}
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
