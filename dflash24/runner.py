"""Fixed-shape forwards: chunked prefill, the one-token decode step, the verify step of T guessed tokens,
and the drafter's block step.

On CUDA every fixed-shape step is one CUDA-graph replay. Its inputs live in static device tensors; the only
shape that varies with the context -- the number of KV rows attention reads -- is bucketed (powers of two),
with one graph per (step kind, length, bucket) captured on first use. With a drafter, short prompts (a chat
turn's new tokens) prefill as replays of the verify step: see `TILE_PREFILL_MAX`.
"""
from __future__ import annotations

import os
from typing import Callable

import torch

from .models.layers import Step
from .plan import prefill_row_bytes
from .quant import kernels as quant_kernels
from .spec.ddtree import Tree, build_tree

# Prompts of at most this many tokens prefill as speculative steps of the decode loop's own verify shape (a chain
# block, or a tree of budget + 1 nodes laid out as a chain) whose every real token is then committed
# (`TargetRunner._prefill_tiles`): CUDA-graph replays of the graphs the loop captures anyway, so no memory is added.
# A tile's rows past the prompt are written where the next tokens overwrite them, and the DeltaNet state advances
# along the real tokens only (`cache.commit`), as after a verify step. AR mode has no verify graph: its tile is a
# chain step of its own, where the memory plan leaves room (engine.AR_TILE). Longer prompts prefill eagerly in
# chunks. Why: an eager prefill of the 27B launches about 1,800 kernels from Python, and up to 1,024 tokens took
# 105-130 ms whatever the length. On an H100 (2026-12-06, BENCHMARKS.md) a 23-node tree tile replays in 12.8 ms:
# 16 / 64 / 128 tokens 12.8 / 38.8 / 77.1 ms against 111 / 117 / 112 ms eagerly, 192 / 256 tokens 115 / 153 against
# 105 / 109. DFLASH24_TILE_PREFILL_MAX=0: always eager.
_tile_max = os.environ.get("DFLASH24_TILE_PREFILL_MAX", "128")
if not _tile_max.isdigit():
    raise ValueError(f"DFLASH24_TILE_PREFILL_MAX must be a number of tokens (0: off), got {_tile_max!r}")
TILE_PREFILL_MAX = int(_tile_max)


def kv_bucket(rows: int, capacity: int, smallest: int = 256) -> int:
    """Smallest power-of-two bucket >= rows (at least `smallest`, at most the cache capacity)."""
    b = smallest
    while b < rows:
        b *= 2
    return min(b, capacity)


class Graphs:
    """CUDA graphs keyed by step shape. `run(key, fn)` calls fn() eagerly (CPU, or graphs off) or replays the
    graph captured from fn(); fn must read its inputs from static tensors and return its outputs."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self._graphs: dict = {}
        self._pool = None
        self._warmup_stream = torch.cuda.Stream() if enabled else None   # one stream: its cached blocks get reused

    def run(self, key, fn: Callable):
        if not self.enabled:
            return fn()
        entry = self._graphs.get(key)
        if entry is not None:
            entry[0].replay()
            return entry[1]
        # First call with this key: run fn once eagerly on the warm-up stream (compiles the kernels; this run
        # is the real step: steps that advance a recurrent state are not idempotent, so the capture below
        # must not be replayed for this call), then capture the graph for the next calls.
        stream = self._warmup_stream
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            out = fn()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            captured = fn()
        self._pool = graph.pool()
        self._graphs[key] = (graph, captured)
        return out


def _chain_tree(tokens: torch.Tensor) -> Tree:
    """tokens [T] as a Tree whose node n is the child of node n - 1 (a chain in the tree step's form)."""
    T, dev = tokens.shape[0], tokens.device
    idx = torch.arange(T, device=dev)
    return Tree(tokens, idx - 1, idx, torch.ones(T, T, dtype=torch.bool, device=dev).tril())


class TargetRunner:
    def __init__(self, model, cache, device: torch.device, use_graphs: bool, capture: tuple[int, ...] = (),
                 max_step_tokens: int = 64):
        self.model, self.cache, self.device = model, cache, device
        self.capture = capture
        self.capacity = cache.capacity
        self.graphs = Graphs(use_graphs and device.type == "cuda")
        # short prompts as speculative steps of this shape (TILE_PREFILL_MAX): ("chain", block) / ("tree", nodes);
        # the engine sets it where graphs run (tests set it to run the path eagerly)
        self.tile: tuple[str, int] | None = None
        self._ids = torch.zeros(max_step_tokens, dtype=torch.long, device=device)
        self._base = torch.zeros(1, dtype=torch.long, device=device)
        self._offsets = torch.arange(max_step_tokens, device=device)
        # tree verification inputs (static copies of the Tree the drafter built)
        self._depth = torch.zeros(max_step_tokens, dtype=torch.long, device=device)
        self._parents = torch.zeros(max_step_tokens, dtype=torch.long, device=device)
        self._anc = torch.zeros(max_step_tokens, max_step_tokens, dtype=torch.bool, device=device)

    @torch.inference_mode()
    def prefill(self, ids: torch.Tensor, start: int, chunk: int, on_features: Callable | None = None):
        """Run ids [T] at positions start.. in chunks; returns the logits of the last token [1, V].
        on_features(features [t, F], first_position) receives each chunk's captured features (the drafter
        consumes them chunk by chunk, so a long prompt never holds all of them at once)."""
        h = None
        if start == 0 and hasattr(self.cache, "reset"):
            self.cache.reset()                 # recurrent (DeltaNet) state: a new sequence starts from zero
        tiles = self.prefill_tile_count(ids.shape[0], start)
        if tiles:
            return self._prefill_tiles(ids, start, tiles, on_features)
        cfg = self.model.cfg                   # a chunk shorter than planned: its unused rows' memory as scratch
        with quant_kernels.scratch_plan(min(chunk, self.capacity), prefill_row_bytes(cfg.dim, cfg.ffn_dim)):
            for s in range(0, ids.shape[0], chunk):
                part = ids[s:s + chunk]
                step = Step.sequential(start + s, part.shape[0], device=self.device)
                h, f = self.model(part, step, self.cache, self.capture)
                if f is not None and on_features is not None:
                    on_features(f, start + s)
        return self.model.logits(h[-1:])

    def prefill_tile_count(self, n: int, start: int) -> int:
        """How many tiles a prefill of n tokens at `start` takes (`TILE_PREFILL_MAX`), or 0 for the eager chunks: no
        step shape given (`tile` None: graphs off, or AR mode without room for its own), a longer prompt, the
        batch-invariant mode (its prefill bits must be the eager 64-token chunks'), a quantized KV cache whose
        content check is still to run on a real prompt (graph replays skip it), or tiles reaching past the cache."""
        kv = getattr(self.cache, "kv", self.cache)
        if (self.tile is None or not 0 < n <= TILE_PREFILL_MAX
                or quant_kernels.BATCH_INVARIANT or kv.probe_pending(n)):
            return 0
        t = self.tile[1]
        tiles = -(-n // t)
        return tiles if start + tiles * t <= self.capacity else 0

    def _prefill_tiles(self, ids: torch.Tensor, start: int, tiles: int, on_features: Callable | None):
        """Prefill ids in `tiles` tiles (`prefill_tile_count`): each tile one verify step of the loop's shape (its
        rows past the prompt hold token 0), then every real token committed."""
        kind, t = self.tile
        pos, logits, n = start, None, 0
        for _ in range(tiles):
            part = ids[pos - start:pos - start + t]
            n = part.shape[0]
            block = torch.nn.functional.pad(part, (0, t - n))
            if kind == "chain":
                logits, f = self.forward_fixed(block, pos, speculative=True)
                step = self.verify_step(t, pos)
            else:
                logits, f = self.forward_tree(_chain_tree(block), pos)
                step = self.tree_commit_step(t)
            self.cache.commit(step, torch.arange(n, device=self.device), pos)
            if f is not None and on_features is not None:
                on_features(f[:n], pos)
            pos += n
        return logits[n - 1:n].clone()             # the graph's output buffer is the next verify step's

    def _step(self, n: int, rows: int, speculative: bool) -> Step:
        pos = self._base + self._offsets[:n]
        return Step(pos, pos, rows, speculative=speculative)

    def _forward(self, n: int, rows: int, speculative: bool):
        step = self._step(n, rows, speculative)
        h, f = self.model(self._ids[:n], step, self.cache, self.capture)
        return self.model.logits(h), f

    @torch.inference_mode()
    def decode(self, token: torch.Tensor, pos: int):
        """One token at position pos -> (logits [1, V], features [1, F] or None). token: [1] on device."""
        return self.forward_fixed(token.view(1), pos, speculative=False)

    @torch.inference_mode()
    def forward_fixed(self, tokens: torch.Tensor, pos: int, speculative: bool):
        """tokens [T] at positions pos..pos+T-1 -> (logits [T, V], features [T, F] or None).
        speculative=True: a chain of guesses (recurrent state kept until `commit`)."""
        n = tokens.shape[0]
        self._ids[:n].copy_(tokens)
        self._base.fill_(pos)
        rows = kv_bucket(pos + n, self.capacity)
        return self.graphs.run(("target", n, rows, speculative), lambda: self._forward(n, rows, speculative))

    def _tree_step(self, n: int, rows: int) -> Step:
        # visibility in compact form: the Triton kernel reads base/ancestors; the SDPA path builds the mask
        return Step(self._base + self._depth[:n], self._base + self._offsets[:n], rows, speculative=True,
                    parents=self._parents[:n], tree=(self._base, self._anc[:n, :n]))

    @torch.inference_mode()
    def forward_tree(self, tree: Tree, pos: int):
        """Verify a DDTree whose root sits at position pos: node n is written at row pos + n, at rope position
        pos + depth, and sees the context and its ancestors. -> (logits [N, V], features [N, F] or None)."""
        n = tree.tokens.shape[0]
        self._ids[:n].copy_(tree.tokens)
        self._depth[:n].copy_(tree.depth)
        self._parents[:n].copy_(tree.parents)
        self._anc[:n, :n].copy_(tree.ancestors)
        self._base.fill_(pos)
        rows = kv_bucket(pos + n, self.capacity)

        def fn():
            step = self._tree_step(n, rows)
            h, f = self.model(self._ids[:n], step, self.cache, self.capture)
            return self.model.logits(h), f
        return self.graphs.run(("tree", n, rows), fn)

    def tree_commit_step(self, n: int) -> Step:
        """The Step of the last forward_tree of n nodes (its slots and parents; for cache.commit)."""
        return Step(self._base + self._depth[:n], self._base + self._offsets[:n], 0, speculative=True,
                    parents=self._parents[:n])

    def verify_step(self, n: int, pos: int) -> Step:
        """The Step a speculative forward_fixed of n tokens at pos used (for cache.commit)."""
        return Step(torch.arange(pos, pos + n, device=self.device), torch.arange(pos, pos + n, device=self.device),
                    kv_bucket(pos + n, self.capacity), speculative=True)


class DraftRunner:
    """The drafter's block step and context update, with the target's embedding and LM head."""

    def __init__(self, drafter, cache, embed, lm_head, device: torch.device, use_graphs: bool):
        self.drafter, self.cache, self.embed, self.lm_head = drafter, cache, embed, lm_head
        self.graphs = Graphs(use_graphs and device.type == "cuda")
        self._last = torch.zeros(1, dtype=torch.long, device=device)
        self._start = torch.zeros(1, dtype=torch.long, device=device)
        self._ctx_inputs: dict = {}
        self.device = device

    @torch.inference_mode()
    def add_context(self, features: torch.Tensor, start: int):
        """Project the target features of committed tokens start.. into the draft cache (prefill: eager)."""
        positions = torch.arange(start, start + features.shape[0], device=self.device)
        self.drafter.add_context(features, positions, self.cache)

    @torch.inference_mode()
    def add_committed(self, features: torch.Tensor, rows: torch.Tensor, start: int):
        """After a verify step: features [T, F] of the step's tokens, rows [T] = the committed tokens' indices
        in order, padded to T with any index. Writes draft rows start..start+T-1 as one fixed-shape step: the
        padding rows lie beyond the committed context, where the next step overwrites them before any
        draft reads them."""
        T = features.shape[0]
        key = ("context", T)
        if key not in self._ctx_inputs:      # static inputs: a graph reads them at their captured addresses
            self._ctx_inputs[key] = (torch.zeros_like(features), torch.zeros(T, dtype=torch.long, device=self.device),
                                     torch.arange(T, device=self.device))
        feats, idx, offsets = self._ctx_inputs[key]
        feats.copy_(features)
        idx.copy_(rows)
        self._start.fill_(start)
        self.graphs.run(key, lambda: self.drafter.add_context(feats[idx], self._start + offsets, self.cache))

    @torch.inference_mode()
    def draft(self, last: torch.Tensor, pos: int) -> torch.Tensor:
        """Greedy guesses [B-1] for positions pos+1.. given the last committed token at pos."""
        self._last.copy_(last.view(1))
        self._start.fill_(pos)
        rows = kv_bucket(pos + self.drafter.block_size, self.cache.capacity)

        def fn():
            logits = self.drafter.draft(self._last, self._start, self.cache, self.embed, self.lm_head, kv_rows=rows)
            return logits.argmax(-1)
        return self.graphs.run(("draft", rows), fn)

    @torch.inference_mode()
    def draft_sampled(self, last: torch.Tensor, pos: int, sampler) -> tuple[torch.Tensor, torch.Tensor]:
        """Sampled guesses [B-1] and the processed draft distribution q [B-1, V] they were drawn from (the
        residual chain rule). The block forward is graphed; sampling runs eagerly with the request's
        generator (sampler: dflash24.spec.sampling.Sampler)."""
        self._last.copy_(last.view(1))
        self._start.fill_(pos)
        rows = kv_bucket(pos + self.drafter.block_size, self.cache.capacity)
        logits = self.graphs.run(("draft_logits", rows), lambda: self.drafter.draft(
            self._last, self._start, self.cache, self.embed, self.lm_head, kv_rows=rows))
        return sampler.draft_sample(logits, last)

    @torch.inference_mode()
    def draft_tree(self, last: torch.Tensor, pos: int, budget: int, top_k: int = 8) -> Tree:
        """A DDTree of budget + 1 nodes (root = last, at pos) from the drafter's top-k per position."""
        self._last.copy_(last.view(1))
        self._start.fill_(pos)
        rows = kv_bucket(pos + self.drafter.block_size, self.cache.capacity)

        def fn():
            logits = self.drafter.draft(self._last, self._start, self.cache, self.embed, self.lm_head, kv_rows=rows)
            logp, tok = torch.topk(logits.float().log_softmax(-1), top_k, dim=-1)      # [B-1, K]
            return build_tree(self._last, logp, tok, budget)
        return self.graphs.run(("tree", rows, budget, top_k), fn)
