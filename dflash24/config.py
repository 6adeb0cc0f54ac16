"""Every engine knob in one frozen config, with defaults and validation."""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from pathlib import Path

import torch

SPEC_MODES = ("ar", "chain", "tree")
KV_CACHE_TYPES = ("bf16", "f16", "f32", "q8_0", "q4_0", "tq3")    # q8_0 / q4_0 / tq3: cache/kvquant.py
_DENSE_KV = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}


class ConfigError(ValueError):
    pass


@functools.lru_cache(maxsize=1)
def _cpuinfo() -> str:
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""


def cpu_has_bf16(cpuinfo: str | None = None) -> bool:
    """Whether this CPU computes in bfloat16 natively (x86 AVX512-BF16 or AMX-BF16, Arm BF16; read from
    /proc/cpuinfo, False where there is none). There a bfloat16 model reads half the bytes of a float32 one per
    token: the embedded 0.5B decodes at 13.6 tok/s against 6.7 on two such cores. Elsewhere PyTorch emulates
    bfloat16 matmuls, slower than float32."""
    if cpuinfo is None:
        cpuinfo = _cpuinfo()
    return re.search(r"^(flags|Features)\s*:.*\b(avx512_bf16|amx_bf16|bf16)\b", cpuinfo, re.M) is not None


@dataclass(frozen=True)
class EngineConfig:
    model: str | None = None            # GGUF path; None = the embedded default model
    draft: str | None = None            # DFlash drafter (dir with config.json + safetensors, or GGUF)
    spec: str | None = None             # ar | chain | tree; None = fastest lossless mode available
    ctx: int = 4096                     # KV capacity in tokens (prompt + generation)
    device: str | None = None           # None = cuda if available else cpu
    dtype: str | None = None            # activations: None = bfloat16 on cuda, float32 (exact) on cpu; "auto" (the
                                        # CLI's default) = bfloat16 on cuda and on CPUs with cpu_has_bf16()
    cache_type_k: str = "bf16"
    cache_type_v: str = "bf16"
    prefill_chunk: int | None = None    # prompt tokens per prefill forward; None = auto (plan.PREFILL_CHUNKS)
    ddtree_budget: int = 22
    cuda_graphs: bool = True
    chain_accept: str = "match"         # sampled chain verification: match (greedy drafts) | residual (p/q rule)
    prefix_cache: bool = True           # reuse the caches for the longest common prefix with the last request
    prefix_cache_mb: int | None = None  # DeltaNet snapshot budget; None = 512 on cuda, 256 on cpu
    prefix_cache_host: bool = False     # keep the snapshots in pinned host memory instead of the GPU
    embed_on_host: bool = False         # token_embd rows in pinned host memory, gathered over PCIe (CUDA)
    attn_window: int = 0                # > 0: target attention sees only the last N positions (changes output)

    def __post_init__(self):
        if self.spec is not None and self.spec not in SPEC_MODES:
            raise ConfigError(f"--spec must be one of {', '.join(SPEC_MODES)}, got {self.spec!r}")
        if self.ctx < 16:
            raise ConfigError(f"--ctx must be at least 16, got {self.ctx}")
        if not 1 <= self.ddtree_budget <= 127:
            raise ConfigError(f"--ddtree-budget must be between 1 and 127, got {self.ddtree_budget}")
        if self.attn_window and self.attn_window < max(32, self.ddtree_budget + 1):
            raise ConfigError(f"--attn-window must be 0 (off) or at least {max(32, self.ddtree_budget + 1)} "
                              f"(32, and deeper than a DDTree of --ddtree-budget {self.ddtree_budget}), "
                              f"got {self.attn_window}")
        if self.chain_accept not in ("match", "residual"):
            raise ConfigError(f"--chain-accept must be match or residual, got {self.chain_accept!r}")
        if self.prefill_chunk is not None and self.prefill_chunk < 1:
            raise ConfigError("--prefill-chunk must be positive")
        if self.prefix_cache_mb is not None and self.prefix_cache_mb < 0:
            raise ConfigError(f"--prefix-cache-mb must be >= 0, got {self.prefix_cache_mb}")
        if self.dtype not in (None, "auto", "float32", "bfloat16", "float16"):
            raise ConfigError(f"--dtype must be auto, float32, bfloat16 or float16, got {self.dtype!r}")
        for name in ("cache_type_k", "cache_type_v"):
            if getattr(self, name) not in KV_CACHE_TYPES:
                raise ConfigError(f"--{name.replace('_', '-')} {getattr(self, name)!r} is not available "
                                  f"(this build supports {', '.join(KV_CACHE_TYPES)})")

    def check_device(self) -> None:
        """Refuse a --device this machine cannot run on (the engine calls this before it loads anything;
        configs for planning may name cuda on any machine)."""
        if not self.device:
            return
        try:
            device = torch.device(self.device)
        except (RuntimeError, TypeError):
            raise ConfigError(f"--device {self.device!r} is not a device (use cpu, cuda or cuda:N)") from None
        if device.type not in ("cpu", "cuda"):
            raise ConfigError(f"--device {self.device!r}: dflash24 runs on cpu or cuda")
        if device.type == "cuda":
            n = torch.cuda.device_count() if torch.cuda.is_available() else 0
            if n == 0:
                raise ConfigError(f"--device {self.device!r}: PyTorch sees no CUDA device (a CPU build of torch, or "
                                  f"no driver); use --device cpu")
            if device.index is not None and device.index >= n:
                raise ConfigError(f"--device {self.device!r}: PyTorch sees {n} CUDA device(s) (cuda:0..cuda:{n - 1})")

    def torch_device(self) -> torch.device:
        if self.device:
            return torch.device(self.device)
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")

    def torch_dtype(self) -> torch.dtype:
        if self.dtype and self.dtype != "auto":
            return getattr(torch, self.dtype)
        if self.torch_device().type == "cuda" or (self.dtype == "auto" and cpu_has_bf16()):
            return torch.bfloat16
        return torch.float32

    def prefix_cache_bytes(self) -> int:
        """The snapshot budget of the prefix cache in bytes (0 when it is off)."""
        if not self.prefix_cache:
            return 0
        mb = self.prefix_cache_mb if self.prefix_cache_mb is not None else (
            512 if self.torch_device().type == "cuda" else 256)
        return mb << 20

    def _kv_type(self, t: str):
        if t in _DENSE_KV:
            if self.torch_device().type == "cpu" and t == "bf16":
                return torch.float32          # CPU runs the exact reference path
            return _DENSE_KV[t]
        return t                              # quantized: the format name (KVCache encodes at write)

    def kv_types(self) -> tuple:
        """(K type, V type) for KVCache / new_cache: each a torch dtype (dense) or 'q8_0' | 'q4_0' | 'tq3'."""
        return self._kv_type(self.cache_type_k), self._kv_type(self.cache_type_v)

    def kv_dtype(self) -> torch.dtype:
        """The dtype attention computes in: the dense cache dtype when K and V share one dense type, else
        the activation dtype (quantized sides are decoded to it; mixed dense sides are promoted)."""
        k, v = self.kv_types()
        if isinstance(k, torch.dtype) and k == v:
            return k
        return self.torch_dtype()


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 256
    temperature: float = 0.0            # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0                      # 0 = off
    min_p: float = 0.0                  # 0 = off; drop tokens below min_p * the top token's probability
    repetition_penalty: float = 1.0     # 1 = off; prompt + generated tokens (CTRL rule)
    frequency_penalty: float = 0.0      # generated tokens, per occurrence (OpenAI)
    presence_penalty: float = 0.0       # generated tokens, once (OpenAI)
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = field(default_factory=tuple)
    ignore_eos: bool = False

    def __post_init__(self):
        if self.max_tokens < 1:
            raise ConfigError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if not 0 <= self.temperature < float("inf"):                   # NaN fails this too
            raise ConfigError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ConfigError(f"top_k must be >= 0, got {self.top_k}")
        if not 0 <= self.min_p <= 1:
            raise ConfigError(f"min_p must be in [0, 1], got {self.min_p}")
        if not 0 < self.repetition_penalty <= 10:
            raise ConfigError(f"repetition_penalty must be in (0, 10], got {self.repetition_penalty}")
        for name in ("frequency_penalty", "presence_penalty"):
            if not -2 <= getattr(self, name) <= 2:
                raise ConfigError(f"{name} must be in [-2, 2], got {getattr(self, name)}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def penalized(self) -> bool:
        return self.repetition_penalty != 1 or self.frequency_penalty != 0 or self.presence_penalty != 0
