"""Dense decoder targets: qwen2, qwen3, llama (GGUF layouts as llama.cpp writes them).

Tensors are loaded by their GGUF names: blk.{i}.attn_norm / attn_q(+bias) / attn_k(+bias) / attn_v(+bias) /
attn_q_norm / attn_k_norm (qwen3) / attn_output / ffn_norm / ffn_gate / ffn_up / ffn_down; token_embd,
output_norm, output (absent = tied). q / k / v and gate / up are then stacked where their block types allow
(`qkv`, `ffn_gate_up`: FusedLinear), so each pair or triple that reads the same input costs one matmul.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from ..cache.kv import KVCache
from ..gguf.reader import GGUFError, GGUFFile
from ..quant.linear import FusedLinear
from .layers import Rotary, Step, add_rms_norm, cache_attention, feeds, qk_norm_rope_write, swiglu
from .loading import Loader, check_attention_shape

ARCHS = ("qwen2", "qwen3", "llama")


@dataclass(frozen=True)
class DenseConfig:
    arch: str
    n_layers: int
    dim: int
    ffn_dim: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    vocab_size: int
    rope_theta: float
    rope_dim: int
    rope_neox: bool
    norm_eps: float
    context_length: int

    @classmethod
    def from_gguf(cls, gf: GGUFFile) -> "DenseConfig":
        if gf.arch not in ARCHS:
            raise GGUFError(f"{gf.path}: architecture {gf.arch!r} is not a dense target ({', '.join(ARCHS)})")
        dim, heads = gf.int_value("embedding_length"), gf.int_value("attention.head_count")
        head_dim = gf.int_value("attention.key_length", dim // heads)
        n_kv_heads = gf.int_value("attention.head_count_kv", heads)
        rope_dim = gf.int_value("rope.dimension_count", head_dim)
        check_attention_shape(gf, heads, n_kv_heads, head_dim, rope_dim)
        n_layers = gf.int_value("block_count")
        gf.check_block_count(n_layers)
        return cls(
            arch=gf.arch, n_layers=n_layers, dim=dim, ffn_dim=gf.int_value("feed_forward_length"), n_heads=heads,
            n_kv_heads=n_kv_heads, head_dim=head_dim, vocab_size=gf.tensor("token_embd.weight").shape[0],
            rope_theta=gf.float_value("rope.freq_base", 10000.0), rope_dim=rope_dim, rope_neox=gf.arch != "llama",
            norm_eps=gf.float_value("attention.layer_norm_rms_epsilon", 1e-6),
            context_length=gf.int_value("context_length", 4096))


class DenseBlock(torch.nn.Module):
    def __init__(self, cfg: DenseConfig, ld: Loader, i: int):
        super().__init__()
        p, D, Hq, Hk = f"blk.{i}.", cfg.head_dim, cfg.n_heads, cfg.n_kv_heads
        self.cfg, self.index = cfg, i
        self.attn_norm = ld.vector(p + "attn_norm.weight", cfg.dim)
        self.qkv = FusedLinear(ld.linear(p + "attn_q", cfg.dim, Hq * D), ld.linear(p + "attn_k", cfg.dim, Hk * D),
                               ld.linear(p + "attn_v", cfg.dim, Hk * D))          # one matmul where types allow
        self.attn_q_norm = ld.vector(p + "attn_q_norm.weight", D, optional=True)
        self.attn_k_norm = ld.vector(p + "attn_k_norm.weight", D, optional=True)
        self.attn_output = ld.linear(p + "attn_output", Hq * D, cfg.dim)
        self.ffn_norm = ld.vector(p + "ffn_norm.weight", cfg.dim)
        self.ffn_gate_up = FusedLinear(ld.linear(p + "ffn_gate", cfg.dim, cfg.ffn_dim),
                                       ld.linear(p + "ffn_up", cfg.dim, cfg.ffn_dim))
        self.ffn_down = ld.linear(p + "ffn_down", cfg.ffn_dim, cfg.dim)

    def forward(self, x, mlp_out, step: Step, cache, rope: Rotary, visible):
        """(x, mlp_out) -> (x', mlp_out'): the layer's input is x + mlp_out (the previous layer's MLP output,
        None for the first layer), added inside this layer's first norm; its output is x' + mlp_out'."""
        cfg, T = self.cfg, x.shape[0]
        x, h = add_rms_norm(x, mlp_out, self.attn_norm, cfg.norm_eps, **feeds(T))   # the GEMVs' int8 / pair order too
        q, k, v = self.qkv(h)
        q = qk_norm_rope_write(q.view(T, cfg.n_heads, cfg.head_dim), k.view(T, cfg.n_kv_heads, cfg.head_dim),
                               v.view(T, cfg.n_kv_heads, cfg.head_dim), self.attn_q_norm, self.attn_k_norm,
                               cfg.norm_eps, rope, step.positions, step.slots, cache, self.index)
        k_all, v_all = cache.layer(self.index)
        o = cache_attention(q, k_all, v_all, step, cfg.head_dim ** -0.5, visible)
        x, h = add_rms_norm(x, self.attn_output(o.reshape(T, -1)), self.ffn_norm, cfg.norm_eps, **feeds(T))
        return x, swiglu(h, self.ffn_gate_up, self.ffn_down)


class DenseModel(torch.nn.Module):
    """forward(ids, step, cache) -> final hidden states [T, dim]; logits(h) -> [T, vocab]."""

    attn_window = 0      # > 0: sliding-window attention over the last attn_window positions (--attn-window)

    def __init__(self, cfg: DenseConfig, ld: Loader, max_positions: int):
        super().__init__()
        self.cfg = cfg
        self.token_embd = ld.embedding("token_embd.weight", cfg.vocab_size, cfg.dim)
        self.blk = torch.nn.ModuleList(DenseBlock(cfg, ld, i) for i in range(cfg.n_layers))
        self.output_norm = ld.vector("output_norm.weight", cfg.dim)
        self.output = ld.linear("output", cfg.dim, cfg.vocab_size, optional=True) or ld.tied_output("token_embd.weight")
        freq_factors = ld.vector("rope_freqs.weight", cfg.rope_dim // 2, optional=True)
        self.rope = Rotary(cfg.rope_dim, cfg.rope_theta, max_positions, cfg.rope_neox, ld.device, freq_factors)
        ld.finish()

    @classmethod
    def from_gguf(cls, gf: GGUFFile, device="cpu", dtype=torch.float32, max_positions: int | None = None,
                  embed_on_host: bool = False):
        cfg = DenseConfig.from_gguf(gf)
        return cls(cfg, Loader(gf, device, dtype, embed_on_host=embed_on_host), max_positions or cfg.context_length)

    def new_cache(self, capacity: int, dtype, device, max_spec_tokens: int = 0, max_tree_nodes: int = 0) -> KVCache:
        """The per-sequence state this model needs: keys/values of every block. (A dense target needs no
        speculative scratch: rejected tokens' K/V rows are simply overwritten later.)"""
        return KVCache(self.cfg.n_layers, capacity, self.cfg.n_kv_heads, self.cfg.head_dim, dtype, device)

    def forward(self, ids: torch.Tensor, step: Step, cache, capture: tuple[int, ...] = ()):
        """ids: [T]. Returns (hidden [T, dim], captured): `captured` holds the outputs of the layers in
        `capture` (after their residual), concatenated on the last dim: [T, len(capture) * dim]."""
        if self.attn_window:
            step = dataclasses.replace(step, window=self.attn_window)
        x = self.token_embd(ids)
        visible = step.visibility()                        # computed once, shared by every layer
        feats, mlp_out = [], None
        for blk in self.blk:
            x, mlp_out = blk(x, mlp_out, step, cache, self.rope, visible)
            if blk.index in capture:
                feats.append(x + mlp_out)                  # the layer's output (the next layer adds it again)
        _, h = add_rms_norm(x, mlp_out, self.output_norm, self.cfg.norm_eps, **feeds(ids.shape[0]))
        return h, (torch.cat(feats, dim=-1) if feats else None)

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """fp32 logits, never rounded to bf16 (bf16 logits tie often: one bf16 step is 0.125 at 16-32, and a
        tie broken differently by the decode and verify paths would change greedy output)."""
        return self.output(h, out_dtype=torch.float32)
