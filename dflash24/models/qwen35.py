"""qwen35 hybrid target (Qwen3.5 / Qwen3.6): Gated DeltaNet layers + gated full-attention every 4th layer.

GGUF layout as llama.cpp writes it (FACTS.md section 1). Module attributes carry the GGUF tensor names:
every layer: attn_norm, post_attention_norm, ffn_gate / ffn_up / ffn_down;
attention layers ((i+1) % interval == 0): attn_q (q and gate per head: [T, H, 2D]), attn_k, attn_v,
  attn_q_norm, attn_k_norm, attn_output;
DeltaNet layers: attn_qkv ([q | k | v] -> causal conv), attn_gate (z), ssm_beta, ssm_alpha, ssm_a (-exp(A_log)),
  ssm_dt.bias, ssm_conv1d [C, K], ssm_norm (plain weight), ssm_out.
GGUF value heads are in tiled order (value head h reads key head h % Hk). Norms hold their final weight
(llama.cpp added the +1 of HF's zero-centred RMSNorm; ssm_norm never had it).
`from_hf` converts a Hugging Face checkpoint into this convention in memory and reuses the same modules.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
from dataclasses import dataclass

import numpy as np
import torch
from gguf import GGMLQuantizationType as QT

from ..cache.hybrid import HybridCache
from ..gguf.reader import GGUFError, GGUFFile, TensorInfo
from ..kernels.deltanet import (causal_conv, conv_qk, gate_beta, gated_delta_rule, l2norm, tree_conv,
                                tree_conv_index, use_fused_conv)
from ..quant.linear import FusedLinear
from .layers import (Rotary, Step, add_rms_norm, cache_attention, feeds, flat, qk_norm_rope_write, rms_norm, silu_mul,
                     swiglu)
from .loading import Loader, check_attention_shape

log = logging.getLogger("dflash24")


@dataclass(frozen=True)
class Qwen35Config:
    n_layers: int              # decoder layers (MTP layers excluded)
    dim: int
    ffn_dim: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    vocab_size: int
    rope_theta: float
    rope_dim: int              # partial RoPE: the first rope_dim dims of each head
    norm_eps: float
    context_length: int
    attn_interval: int         # layer i is full attention iff (i + 1) % attn_interval == 0
    conv_kernel: int
    ssm_k_heads: int           # ssm.group_count
    ssm_k_dim: int             # ssm.state_size
    ssm_v_heads: int           # ssm.time_step_rank
    ssm_v_dim: int             # ssm.inner_size / ssm.time_step_rank
    n_nextn: int = 0           # MTP layers present in the file (ignored)

    def is_attention(self, i: int) -> bool:
        return (i + 1) % self.attn_interval == 0

    @property
    def attention_layers(self) -> list[int]:
        return [i for i in range(self.n_layers) if self.is_attention(i)]

    @property
    def conv_dim(self) -> int:
        return 2 * self.ssm_k_heads * self.ssm_k_dim + self.ssm_v_heads * self.ssm_v_dim

    @classmethod
    def from_gguf(cls, gf: GGUFFile) -> "Qwen35Config":
        if gf.arch != "qwen35":
            raise GGUFError(f"{gf.path}: architecture {gf.arch!r} is not qwen35")

        def num(key):                           # per-layer arrays (hybrid files may store head_count_kv so)
            return gf.int_value(key, per_layer=True)

        blocks, nextn = num("block_count"), gf.int_value("nextn_predict_layers", 0, minimum=0)
        if nextn >= blocks:
            raise GGUFError(f"{gf.path}: {nextn} MTP layers (nextn_predict_layers) of {blocks} blocks leave no decoder")
        gf.check_block_count(blocks - nextn)
        heads, kv_heads = num("attention.head_count"), num("attention.head_count_kv")
        rope_dim = num("rope.dimension_count")
        k_heads, v_heads, inner = num("ssm.group_count"), num("ssm.time_step_rank"), num("ssm.inner_size")
        if inner % v_heads:
            raise GGUFError(f"{gf.path}: ssm.inner_size {inner} is not a multiple of ssm.time_step_rank {v_heads}")
        if v_heads % k_heads:
            raise GGUFError(f"{gf.path}: ssm.time_step_rank {v_heads} (value heads) is not a multiple of "
                            f"ssm.group_count {k_heads} (key heads)")
        k_len, v_len = num("attention.key_length"), num("attention.value_length")
        if k_len != v_len:
            raise GGUFError(f"{gf.path}: attention key_length {k_len} != value_length {v_len} is not supported")
        check_attention_shape(gf, heads, kv_heads, k_len, rope_dim)
        return cls(
            n_layers=blocks - nextn, dim=num("embedding_length"), ffn_dim=num("feed_forward_length"),
            n_heads=heads, n_kv_heads=kv_heads, head_dim=k_len,
            vocab_size=gf.tensor("token_embd.weight").shape[0],
            rope_theta=gf.float_value("rope.freq_base"), rope_dim=rope_dim,
            norm_eps=gf.float_value("attention.layer_norm_rms_epsilon", 1e-6),
            context_length=gf.int_value("context_length", 262144),
            attn_interval=num("full_attention_interval"), conv_kernel=num("ssm.conv_kernel"),
            ssm_k_heads=k_heads, ssm_k_dim=num("ssm.state_size"),
            ssm_v_heads=v_heads, ssm_v_dim=inner // v_heads, n_nextn=nextn)

    @classmethod
    def from_hf(cls, hf) -> "Qwen35Config":
        """From a transformers config (Qwen3_5Config / Qwen3_5TextConfig) or a config.json dict."""
        c = hf if isinstance(hf, dict) else hf.to_dict()
        c = c.get("text_config") or c
        rp = c.get("rope_parameters") or c.get("rope_scaling") or {}
        head_dim = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
        layer_types = c.get("layer_types")
        interval = c.get("full_attention_interval", 4)
        if layer_types:
            attn = [i for i, t in enumerate(layer_types) if t == "full_attention"]
            interval = attn[0] + 1 if attn else c["num_hidden_layers"] + 1
            want = [i for i in range(c["num_hidden_layers"]) if (i + 1) % interval == 0]
            if attn != want:
                raise ValueError(f"layer_types {layer_types} are not periodic (full attention every {interval})")
        partial = rp.get("partial_rotary_factor", c.get("partial_rotary_factor", 0.25))
        return cls(
            n_layers=c["num_hidden_layers"], dim=c["hidden_size"], ffn_dim=c["intermediate_size"],
            n_heads=c["num_attention_heads"], n_kv_heads=c["num_key_value_heads"], head_dim=head_dim,
            vocab_size=c["vocab_size"], rope_theta=float(rp.get("rope_theta", c.get("rope_theta", 1e7))),
            rope_dim=int(head_dim * partial), norm_eps=float(c.get("rms_norm_eps", 1e-6)),
            context_length=int(c.get("max_position_embeddings", 262144)), attn_interval=interval,
            conv_kernel=c.get("linear_conv_kernel_dim", 4), ssm_k_heads=c["linear_num_key_heads"],
            ssm_k_dim=c["linear_key_head_dim"], ssm_v_heads=c["linear_num_value_heads"],
            ssm_v_dim=c["linear_value_head_dim"])

    def gguf_metadata(self) -> dict:
        """The `qwen35.*` metadata llama.cpp writes for this configuration."""
        a = "qwen35."
        md = {a + "block_count": self.n_layers + self.n_nextn, a + "context_length": self.context_length,
              a + "embedding_length": self.dim, a + "feed_forward_length": self.ffn_dim,
              a + "attention.head_count": self.n_heads, a + "attention.head_count_kv": self.n_kv_heads,
              a + "attention.key_length": self.head_dim, a + "attention.value_length": self.head_dim,
              a + "attention.layer_norm_rms_epsilon": self.norm_eps, a + "rope.freq_base": self.rope_theta,
              a + "rope.dimension_count": self.rope_dim, a + "rope.dimension_sections": [11, 11, 10, 0],
              a + "ssm.conv_kernel": self.conv_kernel, a + "ssm.state_size": self.ssm_k_dim,
              a + "ssm.group_count": self.ssm_k_heads, a + "ssm.time_step_rank": self.ssm_v_heads,
              a + "ssm.inner_size": self.ssm_v_heads * self.ssm_v_dim,
              a + "full_attention_interval": self.attn_interval}
        if self.n_nextn:
            md[a + "nextn_predict_layers"] = self.n_nextn
        return md


# Steps of this many tokens or more copy the attention output gate to a tensor of its own before silu_mul (see
# Qwen35Block._attention); shorter steps read it in place. A module setting so benchmarks/ab_steps.py can vary it.
GATE_COPY_FROM_TOKENS = 2


class Qwen35Block(torch.nn.Module):
    def __init__(self, cfg: Qwen35Config, ld: Loader, i: int, slot: int):
        super().__init__()
        p, D = f"blk.{i}.", cfg.head_dim
        self.cfg, self.index, self.slot = cfg, i, slot      # slot: index among layers of the same kind
        self.is_attention = cfg.is_attention(i)
        self.attn_norm = ld.vector(p + "attn_norm.weight", cfg.dim)
        if self.is_attention:
            # q (with its gate), k, v and below the DeltaNet inputs: one matmul where the block types allow
            self.qkv = FusedLinear(ld.linear(p + "attn_q", cfg.dim, cfg.n_heads * D * 2),
                                   ld.linear(p + "attn_k", cfg.dim, cfg.n_kv_heads * D),
                                   ld.linear(p + "attn_v", cfg.dim, cfg.n_kv_heads * D))
            self.attn_q_norm = ld.vector(p + "attn_q_norm.weight", D)
            self.attn_k_norm = ld.vector(p + "attn_k_norm.weight", D)
            self.attn_output = ld.linear(p + "attn_output", cfg.n_heads * D, cfg.dim)
        else:
            hv, dv = cfg.ssm_v_heads, cfg.ssm_v_dim
            self.in_proj = FusedLinear(ld.linear(p + "attn_qkv", cfg.dim, cfg.conv_dim),    # raw [q|k|v]
                                       ld.linear(p + "attn_gate", cfg.dim, hv * dv),       # z
                                       ld.linear(p + "ssm_beta", cfg.dim, hv),
                                       ld.linear(p + "ssm_alpha", cfg.dim, hv))
            self.ssm_a = ld.vector(p + "ssm_a", hv)
            self.ssm_dt = ld.vector(p + "ssm_dt.bias", hv)
            self.ssm_conv1d = ld.dense(p + "ssm_conv1d.weight", (cfg.conv_dim, cfg.conv_kernel))
            self.ssm_norm = ld.vector(p + "ssm_norm.weight", dv)
            self.ssm_out = ld.linear(p + "ssm_out", hv * dv, cfg.dim)
        self.post_attention_norm = ld.vector(p + "post_attention_norm.weight", cfg.dim)
        self.ffn_gate_up = FusedLinear(ld.linear(p + "ffn_gate", cfg.dim, cfg.ffn_dim),
                                       ld.linear(p + "ffn_up", cfg.dim, cfg.ffn_dim))
        self.ffn_down = ld.linear(p + "ffn_down", cfg.ffn_dim, cfg.dim)

    def _attention(self, h, step: Step, kv, rope: Rotary, visible):
        cfg, T, D = self.cfg, h.shape[0], self.cfg.head_dim
        qg, k, v = self.qkv(h)
        qg = qg.view(T, cfg.n_heads, 2 * D)                                 # per head: [q | gate]
        q, gate = qg[..., :D], qg[..., D:]                                  # [T, H, D] each, read in place
        q = qk_norm_rope_write(q, k.view(T, cfg.n_kv_heads, D), v.view(T, cfg.n_kv_heads, D), self.attn_q_norm,
                               self.attn_k_norm, cfg.norm_eps, rope, step.positions, step.slots, kv, self.slot)
        k_all, v_all = kv.layer(self.slot)
        o = cache_attention(q, k_all, v_all, step, D ** -0.5, visible)    # [T, H, D]
        # The gate is read in place for a decode step only (0.05 ms off the 27B's step); a verify step copies it
        # first: with it in place the budget-22 tree verify took 0.24 ms longer, all of it in the matmul kernels,
        # and not from where the buffers land (2026-12-05, benchmarks/ab_steps.py policies new / gate_copied /
        # gate_in_place / gate_pad, BENCHMARKS.md).
        gate = gate if T < GATE_COPY_FROM_TOKENS else gate.reshape(T, -1)
        return self.attn_output(silu_mul(gate, o.reshape(T, -1), sigmoid=True, **feeds(T)))   # o * sigmoid(gate)

    def _deltanet(self, h, step: Step, cache: HybridCache, conv_index):
        cfg, T = self.cfg, h.shape[0]
        hk, dk, hv, dv = cfg.ssm_k_heads, cfg.ssm_k_dim, cfg.ssm_v_heads, cfg.ssm_v_dim
        raw, z, b, a = self.in_proj(h)                                      # raw: [T, conv_dim] pre-conv
        window = cache.conv[self.slot]
        x = g = beta = None
        raw_written = False                                # a speculative step's raw rows kept by conv_qk
        if use_fused_conv(raw):     # CUDA: conv (a tree's along each node's ancestors) + SiLU + q/k norms (+ g, beta)
            fused = conv_qk(raw, window, self.ssm_conv1d, hk, dk, update=not step.speculative,
                            gate=(a, b, self.ssm_a, self.ssm_dt),
                            record=cache.raw_rows(self.slot, T) if step.speculative else None, index=conv_index)
            if fused is not None:
                x, g, beta = fused
                raw_written = step.speculative
        if x is not None:
            q = x[:, :hk * dk].reshape(T, hk, dk)
            k = x[:, hk * dk:2 * hk * dk].reshape(T, hk, dk)
        else:
            if not step.speculative:
                x = causal_conv(raw, window, self.ssm_conv1d)               # [T, conv_dim] fp32
            elif conv_index is None:                                        # chain: window left as it is
                x = causal_conv(raw, window, self.ssm_conv1d, update=False)
            else:                                                           # tree: along each node's ancestors
                x = tree_conv(raw, window, self.ssm_conv1d, conv_index)
            q = l2norm(x[:, :hk * dk].reshape(T, hk, dk)) * dk ** -0.5
            k = l2norm(x[:, hk * dk:2 * hk * dk].reshape(T, hk, dk))
        v = x[:, 2 * hk * dk:].reshape(T, hv, dv)
        if g is None:
            g, beta = gate_beta(a, b, self.ssm_a, self.ssm_dt, use_fused_conv(a))   # [T, Hv] fp32; log decay <= 0
        if step.speculative:
            o = gated_delta_rule(q, k, v, g, beta, cache.ssm[self.slot], parents=step.parents,
                                 states=cache.node_states if step.parents is not None else None,
                                 ancestors=step.tree[1] if step.tree is not None else None,
                                 update_state=False, record=cache.record(self.slot, raw, raw_written))
        else:
            o = gated_delta_rule(q, k, v, g, beta, cache.ssm[self.slot])    # [T, Hv, Dv] fp32
        o = rms_norm(o, self.ssm_norm, cfg.norm_eps, gate=z.view(T, hv, dv), out_dtype=h.dtype, **feeds(T))
        return self.ssm_out(flat(o, T))                                     # gated RMSNorm, then out

    def forward(self, x, mlp_out, step: Step, cache: HybridCache, rope: Rotary, visible, conv_index=None):
        """(x, mlp_out) -> (x', mlp_out'): the layer's input is x + mlp_out (the previous layer's MLP output,
        None for the first layer), added inside this layer's first norm; its output is x' + mlp_out'."""
        rows = feeds(x.shape[0])             # decode: the norms also make the GEMVs' int8 x; verify: the pair order
        x, h = add_rms_norm(x, mlp_out, self.attn_norm, self.cfg.norm_eps, **rows)
        if self.is_attention:
            y = self._attention(h, step, cache.kv, rope, visible)
        else:
            y = self._deltanet(h, step, cache, conv_index)
        x, h = add_rms_norm(x, y, self.post_attention_norm, self.cfg.norm_eps, **rows)
        return x, swiglu(h, self.ffn_gate_up, self.ffn_down)


class Qwen35Model(torch.nn.Module):
    """forward(ids, step, cache) -> final hidden states [T, dim]; logits(h) -> [T, vocab].

    Sequential semantics: each forward continues the DeltaNet states of `cache` where the previous one
    left them (call `cache.reset()` before a new sequence; the runner does at position 0).

    Speculative steps (step.speculative): the committed DeltaNet state and conv window stay as they are;
    token t's outputs are those of sequential decoding along its path (chain: tokens 0..t; tree:
    step.parents, topologically ordered, with step.mask the ancestor-only attention mask); the cache
    records what `cache.commit(step, path, base)` needs to advance along the accepted tokens."""

    attn_window = 0      # > 0: the full-attention layers see only the last attn_window positions (--attn-window)

    def __init__(self, cfg: Qwen35Config, ld: Loader, max_positions: int):
        super().__init__()
        self.cfg = cfg
        self.token_embd = ld.embedding("token_embd.weight", cfg.vocab_size, cfg.dim)
        blocks, n_attn, n_delta = [], 0, 0
        for i in range(cfg.n_layers):
            if cfg.is_attention(i):
                blocks.append(Qwen35Block(cfg, ld, i, n_attn))
                n_attn += 1
            else:
                blocks.append(Qwen35Block(cfg, ld, i, n_delta))
                n_delta += 1
        self.blk = torch.nn.ModuleList(blocks)
        self.n_attn_layers, self.n_delta_layers = n_attn, n_delta
        self.output_norm = ld.vector("output_norm.weight", cfg.dim)
        self.output = ld.linear("output", cfg.dim, cfg.vocab_size, optional=True) or ld.tied_output("token_embd.weight")
        self.rope = Rotary(cfg.rope_dim, cfg.rope_theta, max_positions, True, ld.device)
        ld.finish()

    @classmethod
    def from_gguf(cls, gf: GGUFFile, device="cpu", dtype=torch.float32, max_positions: int | None = None,
                  embed_on_host: bool = False):
        cfg = Qwen35Config.from_gguf(gf)
        ignore = tuple(f"blk.{i}." for i in range(cfg.n_layers, cfg.n_layers + cfg.n_nextn))
        if ignore:
            log.info("%s: ignoring %d MTP layer(s) (%s)", gf.path, cfg.n_nextn, ", ".join(p + "*" for p in ignore))
        return cls(cfg, Loader(gf, device, dtype, ignore_prefixes=ignore, embed_on_host=embed_on_host),
                   max_positions or cfg.context_length)

    @classmethod
    def from_hf(cls, source, config=None, device="cpu", dtype=torch.float32, max_positions: int | None = None):
        """From a Hugging Face checkpoint: a directory (config.json + *.safetensors) or a state dict with
        `config` (transformers config or dict). Tensors are converted to the GGUF convention in memory."""
        if isinstance(source, (str, os.PathLike)):
            from safetensors.torch import load_file
            d = os.fspath(source)
            if config is None:
                with open(os.path.join(d, "config.json"), encoding="utf-8") as f:
                    config = json.load(f)
            files = sorted(n for n in os.listdir(d) if n.endswith(".safetensors"))
            if not files:
                raise FileNotFoundError(f"{d}: no *.safetensors files")
            state = {}
            for n in files:
                state.update(load_file(os.path.join(d, n)))
        else:
            if config is None:
                raise ValueError("from_hf with a state dict needs the config")
            state, d = source, "<state dict>"
        cfg = Qwen35Config.from_hf(config)
        mem = MemoryGGUF(d, "qwen35", hf_to_gguf_tensors(state, cfg))
        return cls(cfg, Loader(mem, device, dtype), max_positions or cfg.context_length)

    def new_cache(self, capacity: int, dtype, device, max_spec_tokens: int = 64,
                  max_tree_nodes: int = 0) -> HybridCache:
        """KV of the attention layers + fp32 recurrent state and conv window of every DeltaNet layer, plus
        the speculative scratch: steps of up to `max_spec_tokens` tokens; tree steps up to `max_tree_nodes` nodes
        (node states, Hv*Dk*Dv*4 bytes each, 3 MiB on the 27B, only where `tree_states_needed`)."""
        c = self.cfg
        return HybridCache(self.n_attn_layers, self.n_delta_layers, capacity, c.n_kv_heads, c.head_dim,
                           c.ssm_v_heads, c.ssm_k_dim, c.ssm_v_dim, c.conv_dim, c.conv_kernel, dtype, device,
                           max_spec_tokens=max_spec_tokens, max_tree_nodes=max_tree_nodes)

    def forward(self, ids: torch.Tensor, step: Step, cache: HybridCache, capture: tuple[int, ...] = ()):
        """ids: [T]. Returns (hidden [T, dim], captured [T, len(capture) * dim] or None)."""
        conv_index = None
        if step.parents is not None and not step.speculative:
            raise ValueError("a step with tree parents must be speculative")
        if step.speculative and self.n_delta_layers:
            cache.check_spec_step(ids.shape[0], step.parents is not None)
            if step.parents is not None:
                conv_index = tree_conv_index(step.parents, self.cfg.conv_kernel)   # [T, K], shared by layers
        if self.attn_window:
            step = dataclasses.replace(step, window=self.attn_window)
        x = self.token_embd(ids)
        visible = step.visibility() if self.n_attn_layers else None   # computed once for every attention layer
        feats, mlp_out = [], None
        for blk in self.blk:
            x, mlp_out = blk(x, mlp_out, step, cache, self.rope, visible, conv_index)
            if blk.index in capture:
                feats.append(x + mlp_out)                  # the layer's output (the next layer adds it again)
        _, h = add_rms_norm(x, mlp_out, self.output_norm, self.cfg.norm_eps, **feeds(ids.shape[0]))
        return h, (torch.cat(feats, dim=-1) if feats else None)

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        return self.output(h, out_dtype=torch.float32)     # fp32, never bf16-rounded (see DenseModel.logits)


# -------------------------------------------------------------------------------------------------------
# Hugging Face -> GGUF convention (the facts of llama.cpp's converter; used by from_hf, tests, synth)
# -------------------------------------------------------------------------------------------------------
def grouped_to_tiled(t: torch.Tensor, dim: int, k_heads: int, head_dim: int) -> torch.Tensor:
    """Re-order value heads along `dim` from HF's grouped order (value head h reads key head h // r) to
    GGUF's tiled order (h reads h % k_heads). `dim` has size v_heads * head_dim."""
    shape = list(t.shape)
    dim = dim % len(shape)
    r = shape[dim] // (k_heads * head_dim)
    t = t.reshape(*shape[:dim], k_heads, r, head_dim, *shape[dim + 1:])   # [.., Hk, r, hd, ..]
    return t.transpose(dim, dim + 1).reshape(shape)                       # [.., r, Hk, hd, ..] flattened


def hf_to_gguf_tensors(state: dict[str, torch.Tensor], cfg: Qwen35Config) -> dict[str, torch.Tensor]:
    """HF `Qwen3_5ForCausalLM` / `...ForConditionalGeneration` tensors -> GGUF names, order and values."""
    out: dict[str, torch.Tensor] = {}
    hk, dk, dv = cfg.ssm_k_heads, cfg.ssm_k_dim, cfg.ssm_v_dim
    qk = 2 * hk * dk
    layer_map = {"input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "post_attention_norm.weight",
                 "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
                 "mlp.down_proj.weight": "ffn_down.weight", "self_attn.q_proj.weight": "attn_q.weight",
                 "self_attn.k_proj.weight": "attn_k.weight", "self_attn.v_proj.weight": "attn_v.weight",
                 "self_attn.o_proj.weight": "attn_output.weight", "self_attn.q_norm.weight": "attn_q_norm.weight",
                 "self_attn.k_norm.weight": "attn_k_norm.weight", "linear_attn.in_proj_qkv.weight": "attn_qkv.weight",
                 "linear_attn.in_proj_z.weight": "attn_gate.weight", "linear_attn.in_proj_b.weight": "ssm_beta.weight",
                 "linear_attn.in_proj_a.weight": "ssm_alpha.weight", "linear_attn.A_log": "ssm_a",
                 "linear_attn.dt_bias": "ssm_dt.bias", "linear_attn.conv1d.weight": "ssm_conv1d.weight",
                 "linear_attn.norm.weight": "ssm_norm.weight", "linear_attn.out_proj.weight": "ssm_out.weight"}
    unknown = []
    for name, t in state.items():
        n = name
        for prefix in ("model.language_model.", "model."):
            if n.startswith(prefix):
                n = n[len(prefix):]
                break
        if n.startswith(("mtp.", "visual.", "model.visual.")):
            continue
        if n == "embed_tokens.weight":
            out["token_embd.weight"] = t
        elif n == "lm_head.weight" or name == "lm_head.weight":
            out["output.weight"] = t
        elif n == "norm.weight":
            out["output_norm.weight"] = t.float() + 1
        elif n.startswith("layers."):
            _, i, rest = n.split(".", 2)
            g = layer_map.get(rest)
            if g is None:
                unknown.append(name)
                continue
            if rest.endswith(("layernorm.weight", "q_norm.weight", "k_norm.weight")):
                t = t.float() + 1                                          # zero-centred -> final weight
            elif rest == "linear_attn.A_log":
                t = grouped_to_tiled(-t.float().exp(), 0, hk, 1)
            elif rest == "linear_attn.dt_bias":
                t = grouped_to_tiled(t.float(), 0, hk, 1)
            elif rest in ("linear_attn.in_proj_b.weight", "linear_attn.in_proj_a.weight"):
                t = grouped_to_tiled(t, 0, hk, 1)
            elif rest == "linear_attn.in_proj_z.weight":
                t = grouped_to_tiled(t, 0, hk, dv)
            elif rest == "linear_attn.in_proj_qkv.weight":
                t = torch.cat([t[:qk], grouped_to_tiled(t[qk:], 0, hk, dv)])
            elif rest == "linear_attn.conv1d.weight":
                t = t.reshape(t.shape[0], -1).float()                      # [C, 1, K] -> [C, K]
                t = torch.cat([t[:qk], grouped_to_tiled(t[qk:], 0, hk, dv)])
            elif rest == "linear_attn.out_proj.weight":
                t = grouped_to_tiled(t, 1, hk, dv)
            out[f"blk.{i}.{g}"] = t
        else:
            unknown.append(name)
    if unknown:
        raise ValueError(f"unexpected Hugging Face tensors for qwen3_5: {', '.join(unknown[:8])}")
    return out


def _torch_qtype(t: torch.Tensor):
    return {torch.float32: QT.F32, torch.bfloat16: QT.BF16, torch.float16: QT.F16}.get(t.dtype)


class MemoryGGUF:
    """Tensors held in memory, shaped like a `GGUFFile` for the `Loader` (F32 / BF16 / F16 tensors)."""

    def __init__(self, path: str, arch: str, tensors: dict[str, torch.Tensor], metadata: dict | None = None):
        self.path, self.metadata = path, {"general.architecture": arch, **(metadata or {})}
        self.tensors: dict[str, TensorInfo] = {}
        for name, t in tensors.items():
            t = t.detach().cpu().contiguous()
            if t.dim() == 1:
                t = t.float()
            if _torch_qtype(t) is None:
                t = t.float()
            rows = int(np.prod(t.shape[:-1])) if t.dim() > 1 else 1
            raw = t.view(torch.uint8).reshape(rows, -1).numpy()
            self.tensors[name] = TensorInfo(name, _torch_qtype(t), tuple(t.shape), raw)

    @property
    def arch(self) -> str:
        return self.metadata["general.architecture"]

    def tensor(self, name: str) -> TensorInfo:
        try:
            return self.tensors[name]
        except KeyError:
            raise GGUFError(f"{self.path}: tensor {name!r} is missing") from None
