"""The engine: load a GGUF target once, then generate(prompt_ids, params) -> stream of events.

One sequence at a time (the 24 GB single-user case). The plain autoregressive loop lives here; the
speculative loops live in `dflash24.spec` and share prefill, sampling, stopping and statistics.
"""
from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator

import torch

from .config import ConfigError, EngineConfig, SamplingParams
from .gguf.reader import GGUFError, GGUFFile
from .gguf.template import ChatTemplate
from .gguf.tokenizer import IncrementalDetokenizer, Tokenizer
from .models import load_target
from .models.drafter import load_drafter
from .cache.prefix import PrefixCache
from .plan import check_engine
from . import runner as runner_mod
from .runner import DraftRunner, TargetRunner
from .spec.loops import StepTimer, ar_steps, chain_steps, tree_steps
from .spec.sampling import Sampler

log = logging.getLogger("dflash24")

# AR mode's prefill tiles: a chain step of AR_TILE tokens, its graph captured per KV bucket like a verify step's,
# with AR_TILE tokens of DeltaNet scratch (57 MiB on the 27B; within the plan's speculative scratch of 64 tokens);
# only where the memory plan leaves AR_TILE_FREE_BYTES free, as the plan does not count the graph. On the 27B in AR
# mode (H100, 2026-12-06, BENCHMARKS.md) the device held 17.78 GiB after short prefills with them and 17.81 GiB
# without; 16 / 64 / 128-token prompts took 10.3 / 41.2 / 81.9 ms against 127 / 121 / 125 ms eagerly. (Two graphs of
# their own, 16 and 32 tokens, added 0.19 GiB in tree mode: the margin.)
AR_TILE = 16
AR_TILE_FREE_BYTES = 1 << 30


@dataclass
class Stats:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    prefill_s: float = 0.0
    decode_s: float = 0.0
    steps: int = 0                      # target forwards after prefill
    accept_hist: dict[int, int] = field(default_factory=dict)   # tokens committed per step -> count
    draft_s: float = 0.0
    verify_s: float = 0.0
    mode: str = "ar"
    reused_tokens: int = 0              # prompt tokens taken from the prefix cache
    prefill_tokens: int = 0             # prompt tokens actually prefilled

    @property
    def tokens_per_s(self) -> float:
        return self.completion_tokens / self.decode_s if self.decode_s > 0 else 0.0

    @property
    def prefill_tokens_per_s(self) -> float:
        return self.prompt_tokens / self.prefill_s if self.prefill_s > 0 else 0.0

    @property
    def acceptance_length(self) -> float:
        n = sum(self.accept_hist.values())
        return sum(k * v for k, v in self.accept_hist.items()) / n if n else 0.0

    def as_dict(self) -> dict:
        steps = max(self.steps, 1)
        return {
            "mode": self.mode, "prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
            "prefill_s": round(self.prefill_s, 4), "prefill_tokens_per_s": round(self.prefill_tokens_per_s, 1),
            "decode_s": round(self.decode_s, 4), "tokens_per_s": round(self.tokens_per_s, 2),
            "acceptance_length": round(self.acceptance_length, 3), "steps": self.steps,
            "accept_hist": dict(sorted(self.accept_hist.items())),
            "draft_ms_per_step": round(1e3 * self.draft_s / steps, 3),
            "verify_ms_per_step": round(1e3 * self.verify_s / steps, 3),
            "reused_tokens": self.reused_tokens, "prefill_tokens": self.prefill_tokens,
        }


@dataclass
class Event:
    token_ids: list[int]                # tokens committed by this event
    text: str                           # text they complete (UTF-8 safe; stop strings removed)
    finish_reason: str | None = None    # "stop" | "length" | "cancelled" once finished
    stats: Stats | None = None          # on the final event


def invariant_prefill(config: EngineConfig, device: torch.device) -> EngineConfig:
    """DFLASH24_BATCH_INVARIANT=1 on a GPU: prompts are prefilled in chunks of at most 64 tokens, so they run
    through the same per-token kernels as decode and verify steps (the dot matmul, the decode attention tiles,
    the recurrent DeltaNet kernel): output then does not depend on where chunks or prefix-cache hits cut a
    prompt either. Slower prefill."""
    from .kernels.deltanet import RECURRENT_MAX_T
    from .quant import kernels
    chunk = min(RECURRENT_MAX_T, kernels.SMALL_M)
    small = config.prefill_chunk is not None and config.prefill_chunk <= chunk
    if device.type != "cuda" or not kernels.BATCH_INVARIANT or small:
        return config
    log.warning("DFLASH24_BATCH_INVARIANT=1: prefill in chunks of %d tokens (not %s)", chunk,
                config.prefill_chunk or "auto")
    return dataclasses.replace(config, prefill_chunk=chunk)


def resolve_prefill_chunk(config: EngineConfig, plan) -> EngineConfig:
    """--prefill-chunk not given: on CUDA the memory plan's choice (the largest chunk that fits: larger chunks
    amortize the large-M matmul's dequantization), on the CPU CPU_PREFILL_CHUNK."""
    if config.prefill_chunk is not None:
        return config
    from .plan import CPU_PREFILL_CHUNK
    chunk = plan.settings["prefill_chunk"] if plan is not None else CPU_PREFILL_CHUNK
    return dataclasses.replace(config, prefill_chunk=chunk)


class Engine:
    def __init__(self, config: EngineConfig = EngineConfig()):
        config.check_device()
        self.device, self.dtype = config.torch_device(), config.torch_dtype()
        config = invariant_prefill(config, self.device)
        self.config = config
        path = config.model
        if path is None:
            from .default_model import default_model_path
            path = default_model_path()
        self.model_path = path
        self.gguf = GGUFFile(path)
        self.tokenizer = Tokenizer.from_gguf(self.gguf)
        rows = self.gguf.tensor("token_embd.weight").shape[0]
        if self.tokenizer.vocab_size > rows:
            raise GGUFError(f"{path}: the tokenizer has {self.tokenizer.vocab_size:,} tokens but token_embd.weight "
                            f"has {rows:,} rows (ids past {rows - 1:,} would have no embedding)")
        self.chat_template = ChatTemplate.from_gguf(self.gguf)
        self.plan = check_engine(config, self.gguf, self.device)   # CUDA: refuse what does not fit (metadata only)
        self.config = config = resolve_prefill_chunk(config, self.plan)
        t0 = time.perf_counter()
        self.model = load_target(self.gguf, self.device, self.dtype, max_positions=config.ctx,
                                 embed_on_host=config.embed_on_host)
        self.model.attn_window = config.attn_window     # 0 = full attention (the model's own behaviour)
        drafter = (load_drafter(config.draft, self.device, self.dtype, config.ctx, self.model, target_path=path)
                   if config.draft else None)
        self.spec_mode = config.spec or ("tree" if drafter is not None else "ar")
        if self.spec_mode != "ar" and drafter is None:
            raise ConfigError(f"--spec {self.spec_mode} needs a DFlash drafter (--draft); none is loaded")
        if self.device.type == "cuda":
            # Loading freed its transients (raw GGUF rows on the device while packing: ~1 GiB for the 27B's LM
            # head). Their cached segments stay reserved, and at long contexts the caches allocated next do not
            # fit in them (one KV buffer of 16 layers x 131K rows is larger): hand them back first. A drafter's
            # weights used to fill them; runs without one measured 1.8 GiB reserved above allocated (BENCHMARKS.md,
            # session of 05:16; the likely cause, not yet re-measured).
            torch.cuda.empty_cache()
        self._build_state(drafter)
        self.load_s = time.perf_counter() - t0
        log.info("loaded %s (%s) on %s in %.1fs", path, self.gguf.arch, self.device, self.load_s)
        if self.device.type == "cuda":
            t1 = time.perf_counter()
            self.warmup()
            log.info("kernels compiled / loaded from Triton's cache in %.1fs", time.perf_counter() - t1)

    def _build_state(self, drafter):
        """Per-sequence state and runners: the target cache (with speculative scratch sized for the drafter's
        block and the tree budget), the verify shape short prompts prefill as (`self.spec_mode`'s), and with a
        drafter its cache and block runner."""
        c = self.config
        spec_tokens = max(drafter.block_size, c.ddtree_budget + 1) if drafter is not None else 1
        tile = self.prefill_tile(drafter)
        self.cache = self.model.new_cache(c.ctx, c.kv_types(), self.device,
                                          max_spec_tokens=max(spec_tokens, tile[1] if tile else 1),
                                          max_tree_nodes=c.ddtree_budget + 1 if drafter is not None else 0)
        self.runner = TargetRunner(self.model, self.cache, self.device, c.cuda_graphs,
                                   tuple(drafter.target_layer_ids) if drafter is not None else (),
                                   max_step_tokens=max(64, spec_tokens))
        self.runner.tile = tile if self.runner.graphs.enabled else None   # eagerly, the chunks are as fast
        self.drafter, self.draft_runner, draft_ring = drafter, None, None
        if drafter is not None:
            draft_cache = drafter.new_cache(c.ctx + drafter.block_size, c.kv_types(), self.device)
            if getattr(draft_cache, "ring", 0):         # sliding layers in rings: what a reuse must find intact
                draft_ring = (drafter.cfg.sliding_window, draft_cache.ring)
            self.draft_runner = DraftRunner(drafter, draft_cache, self.model.token_embd, self.model.output,
                                            self.device, c.cuda_graphs)
        self.prefix = PrefixCache(self.cache, enabled=c.prefix_cache, budget_bytes=c.prefix_cache_bytes(),
                                  host=c.prefix_cache_host, boundary_id=self.tokenizer.token_to_id("<|im_start|>"),
                                  draft_margin=spec_tokens if drafter is not None else None, draft_ring=draft_ring)

    def prefill_tile(self, drafter) -> tuple[str, int] | None:
        """The step shape short prompts prefill as (runner.TILE_PREFILL_MAX): the verify step's graph; AR mode has
        none, and takes a chain step of its own where the plan leaves room for it (`_ar_tile_fits`)."""
        if self.spec_mode == "ar":
            return ("chain", AR_TILE) if self._ar_tile_fits() else None
        return ("chain", drafter.block_size) if self.spec_mode == "chain" else ("tree", self.config.ddtree_budget + 1)

    def _ar_tile_fits(self) -> bool:
        """AR mode's prefill tiles (AR_TILE): on CUDA with graphs, where the memory plan leaves AR_TILE_FREE_BYTES
        free (the plan does not count their graph)."""
        return (self.device.type == "cuda" and self.config.cuda_graphs and runner_mod.TILE_PREFILL_MAX > 0
                and self.plan is not None and self.plan.free >= AR_TILE_FREE_BYTES)

    def warmup(self):
        """Run the target once per prefill shape class -- 1, 9, 24, 48 tokens and a full chunk: the GEMV, the
        small-M tile heights 16 / 32 / 64 (where the runner has prefill tiles, these prompts take them, and their
        graph is captured here), the large-M path, and the attention / DeltaNet variants they pick --
        and one decode step, so Triton compiles these kernels at load and not inside the first request that
        needs them (on the 27B the first prefix-cache hit took 3.86 s, a later one 0.46 s). The caches hold
        nothing afterwards: the prefix cache forgets, and the next prefill starts at position 0, which resets
        the recurrent state; KV rows are overwritten before they are read."""
        n = min(self.config.prefill_chunk, self.config.ctx - 1)
        ids = torch.zeros(n, dtype=torch.long, device=self.device)
        kv = getattr(self.cache, "kv", self.cache)         # the attention layers' KVCache (hybrid: .kv)
        with torch.inference_mode(), kv.no_probe():
            for t in sorted({min(t, n) for t in (1, 9, 24, 48, n)}):
                self.runner.prefill(ids[:t], 0, self.config.prefill_chunk)
            self.runner.decode(ids[:1], n)
        self.prefix.forget()

    def attach_drafter(self, drafter, mode: str = "tree"):
        """Use `drafter` (already built, e.g. by a benchmark) for speculative decoding from now on."""
        self.cache = self.runner = self.draft_runner = self.prefix = None   # free the old state first
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        self.spec_mode = mode
        self._build_state(drafter)

    # -- text helpers ------------------------------------------------------------------------------
    def encode_chat(self, messages: list[dict], tools=None, **template_kwargs) -> list[int]:
        text = self.chat_template.render(messages, add_generation_prompt=True, tools=tools, **template_kwargs)
        return self.tokenizer.encode(text, add_special_tokens=False)

    def encode_raw(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=self.tokenizer.add_bos)

    def check_fits(self, n_prompt: int, max_tokens: int = 1):
        if n_prompt < 1:
            raise ConfigError("the prompt is empty")
        if n_prompt + 1 > self.config.ctx:
            raise ConfigError(f"the prompt has {n_prompt} tokens but the context holds {self.config.ctx} "
                              f"(start with a larger --ctx)")

    # -- generation --------------------------------------------------------------------------------
    def generate(self, prompt_ids: list[int], params: SamplingParams = SamplingParams(),
                 stop: tuple[str, ...] = (), cancelled: Callable[[], bool] | None = None) -> Iterator[Event]:
        """Yield events as tokens are committed; the last event carries finish_reason and stats."""
        self.check_fits(len(prompt_ids))
        stats = Stats(prompt_tokens=len(prompt_ids), mode=self.spec_mode)
        stop_ids = set(params.stop_token_ids) | (set() if params.ignore_eos else self.tokenizer.eos_token_ids)
        out = _OutputStream(self.tokenizer, stop, stop_ids)
        budget = min(params.max_tokens, self.config.ctx - len(prompt_ids))

        t0 = time.perf_counter()
        ids = torch.tensor(prompt_ids, dtype=torch.long, device=self.device)
        on_features = self.draft_runner.add_context if self.draft_runner is not None else None
        use_draft = stats.mode != "ar"
        logits, stats.reused_tokens = self.prefix.prefill(self.runner, prompt_ids, ids, self.config.prefill_chunk,
                                                          on_features, use_draft)
        stats.prefill_tokens = len(prompt_ids) - stats.reused_tokens
        sampler = Sampler(params, ids, logits.shape[-1])         # seeded generator; penalty history
        first = sampler.choose(logits)
        tokens = [int(first)]
        stats.prefill_s = time.perf_counter() - t0
        timer = StepTimer(self.device)
        if stats.mode == "tree":
            steps = tree_steps(self.runner, self.draft_runner, self.cache, first, len(prompt_ids), sampler,
                               stats, timer, self.config.ddtree_budget)
        elif stats.mode == "chain":
            steps = chain_steps(self.runner, self.draft_runner, self.cache, first, len(prompt_ids), sampler,
                                stats, timer, self.config.chain_accept)
        else:
            steps = ar_steps(self.runner, first, len(prompt_ids), sampler)
        steps = self.prefix.track(steps, tokens[0], use_draft, self.cache.capacity)   # records what the caches hold
        t1 = time.perf_counter()
        while True:
            tokens = tokens[: budget - stats.completion_tokens]
            ev = out.push(tokens)
            stats.completion_tokens += len(tokens)
            if ev.finish_reason is None:
                if cancelled is not None and cancelled():
                    ev.finish_reason = "cancelled"
                elif stats.completion_tokens >= budget:
                    ev.finish_reason = "length"
            if ev.finish_reason is not None:
                steps.close()
                ev.text += out.flush()
                stats.decode_s = time.perf_counter() - t1
                stats.draft_s, stats.verify_s = timer.spans(2)
                ev.stats = stats
                yield ev
                return
            if ev.text or ev.token_ids:
                yield ev
            tokens = next(steps, None)
            if tokens is None:                      # the context is full
                tokens, budget = [], stats.completion_tokens
            if stats.mode == "ar":
                stats.steps += 1
                stats.accept_hist[1] = stats.accept_hist.get(1, 0) + 1


class _OutputStream:
    """Turns committed token ids into text deltas: incremental detokenization, stop tokens, stop strings.

    Text that could be the start of a stop string is held back until it is resolved."""

    def __init__(self, tokenizer: Tokenizer, stop: tuple[str, ...], stop_ids: set[int]):
        self.detok = IncrementalDetokenizer(tokenizer)
        self.stop, self.stop_ids = tuple(s for s in stop if s), stop_ids
        self.pending = ""
        self.done = False

    def push(self, token_ids: list[int]) -> Event:
        ev = Event([], "")
        for t in token_ids:
            if self.done:
                break
            if t in self.stop_ids:
                ev.finish_reason, self.done = "stop", True
                break
            ev.token_ids.append(t)
            self.pending += self.detok.push(t)
            cut = self._stop_at()
            if cut is not None:
                ev.text += self.pending[:cut]
                self.pending, ev.finish_reason, self.done = "", "stop", True
                break
        if not self.done:
            keep = self._holdback()
            ev.text += self.pending[:len(self.pending) - keep]
            self.pending = self.pending[len(self.pending) - keep:]
        return ev

    def flush(self) -> str:
        if self.done:
            return ""
        text = self.pending + self.detok.flush()
        self.pending = ""
        cut = self._stop_at(text)
        return text if cut is None else text[:cut]

    def _stop_at(self, text: str | None = None) -> int | None:
        text = self.pending if text is None else text
        hits = [text.find(s) for s in self.stop if s in text]
        return min(hits) if hits else None

    def _holdback(self) -> int:
        keep = 0
        for s in self.stop:
            for n in range(min(len(s) - 1, len(self.pending)), 0, -1):
                if self.pending.endswith(s[:n]):
                    keep = max(keep, n)
                    break
        return keep
