"""Prefix cache: a new request reuses the caches of the previous ones for its longest common token prefix.

The engine holds one sequence. After each request its caches hold, exactly:
  * target KV rows 0..n-1 and draft KV rows 0..d-1 (d <= n) of `held` = the tokens the target has PROCESSED:
    the prompt plus every generated token but the last one (a decode loop yields the token it will process
    at its next step, so the last yielded token -- the first of a plain request, the bonus of a verify step --
    is never in the caches);
  * for a hybrid target, fp32 snapshots of the DeltaNet state + conv window taken at reusable points: the end
    of each prompt, the `<|im_start|>` of the prompt's last two chat-template turns (split points of the
    prefill: the final user turn and the generation prompt), and the end of each generation (= len(held)).
    Every stored snapshot covers a prefix of `held`.

A new prompt of P tokens shares `common` tokens with `held`; the reusable length r is at most common, at most
P - 1 (one token is always prefilled: its logits choose the first new token), at most d when the drafter's
context rows are needed (chain / tree), and on a hybrid target the longest snapshot point within those
bounds (the recurrent state cannot be cut at an arbitrary token). KV rows below r are kept as they are, rows
from r on are overwritten; snapshots past `common` can never be used again and are dropped. Then only
prompt[r:] is prefilled (from position r; the runner resets the recurrent state only at position 0).

KV rows below r are never written by the request that reuses them (every write lands at a position >= r),
so a request that fails or is abandoned leaves a valid (shorter) `held` behind.

Except in a ring: a drafter's sliding layers may keep only their last positions (cache/kv.py WindowedKVCache,
position p at row p % ring), so writing position p overwrites p - ring. Such rows are tracked as a floor,
`draft_from`: rows of positions below it may hold later positions. A reuse of r tokens with the drafter needs
the window before r intact (positions from r + 1 - window); where it is not, nothing is reused.

Snapshots live on the target's device (or in pinned host memory, `host=True`) within `budget_bytes`,
least recently used first out.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Callable, Iterator

import torch


_UNKNOWN = 1 << 62      # draft_from while a request runs: no ring row is known to be intact


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class PrefixCache:
    def __init__(self, cache, *, enabled: bool = True, budget_bytes: int = 256 << 20, host: bool = False,
                 boundary_id: int | None = None, draft_margin: int | None = None,
                 draft_ring: tuple[int, int] | None = None):
        """cache: the target's cache (a HybridCache has `ssm`/`conv` and is snapshotted; a KVCache is not).
        boundary_id: the chat template's turn-start token (`<|im_start|>`), or None.
        draft_margin: with a drafter, the room a chain/tree step needs before the end of the context (the
        loops fall back to plain steps, which do not feed the drafter, past capacity - margin); also the most
        draft rows a step writes ahead of the committed context.
        draft_ring: (window, ring rows) when the drafter's sliding layers keep rings, else None."""
        if budget_bytes < 0:
            raise ValueError(f"the prefix cache budget must be >= 0 bytes, got {budget_bytes}")
        self.cache, self.enabled, self.budget, self.host = cache, enabled, budget_bytes, host
        self.hybrid = hasattr(cache, "ssm") and hasattr(cache, "conv")
        self.boundary_id, self.draft_margin = boundary_id, draft_margin
        self.held: list[int] = []
        self.draft_len = 0
        self.draft_ring = draft_ring
        self.draft_from = 0                 # ring rows of positions below this may hold later positions
        self._draft_kept = 0                # draft_from as the current request found it, after its reuse
        self.snaps: OrderedDict[int, tuple[torch.Tensor, torch.Tensor]] = OrderedDict()   # LRU order
        self.hits = self.reused_tokens = self.evictions = 0

    @property
    def snapshot_bytes(self) -> int:
        return sum(s.nbytes + c.nbytes for s, c in self.snaps.values())

    # -- one request ----------------------------------------------------------------------------------
    def prefill(self, runner, prompt: list[int], ids: torch.Tensor, chunk: int, on_features: Callable | None,
                use_draft: bool) -> tuple[torch.Tensor, int]:
        """Prefill `prompt` (ids: the same tokens on the device) reusing what the caches hold.
        use_draft: the decode loop reads the drafter's context rows (chain / tree).
        Returns (logits of the last prompt token [1, V], reused tokens)."""
        P = len(prompt)
        r = self._reuse(prompt, use_draft)
        draft_ok = on_features is not None and self.draft_len >= r     # draft rows 0..r-1 stay valid
        self.held, self.draft_len = prompt[:r], (r if on_features is not None else 0)
        self._draft_kept = self.draft_from if r else 0
        self.draft_from = _UNKNOWN          # until the prefill is done, any ring row may have been written
        cuts = self._turn_points(prompt, r) if self.enabled and self.hybrid else []
        bounds = [r] + cuts + [P]
        logits = None
        for a, b in zip(bounds, bounds[1:]):
            logits = runner.prefill(ids[a:b], a, chunk, on_features)
            if self.enabled and self.hybrid:
                self._snapshot(b)
        self.held = list(prompt)
        self.draft_len = P if draft_ok else 0
        self.draft_from = self._ring_floor(P)
        if r:
            self.hits += 1
            self.reused_tokens += r
        return logits, r

    def forget(self):
        """Drop what the caches are recorded to hold (their contents were overwritten outside a request)."""
        self.held, self.draft_len, self.draft_from = [], 0, 0
        self.snaps.clear()

    def track(self, steps: Iterator[list[int]], first: int, use_draft: bool, capacity: int) -> "_Tracked":
        """Wrap a decode loop: records what it commits; closing it records the processed tokens (and takes
        the end-of-generation snapshot)."""
        return _Tracked(self, steps, first, use_draft, capacity)

    def _finish(self, generated: list[int], use_draft: bool, capacity: int):
        """The loop ended cleanly after yielding `generated` (the first token included)."""
        if not self.enabled:
            return
        prompt_len = len(self.held)
        self.held = self.held + generated[:-1]
        n = len(self.held)
        self.draft_from = self._ring_floor(n + (self.draft_margin or 0))
        if use_draft and self.draft_len == prompt_len and self.draft_margin is not None \
                and n + self.draft_margin <= capacity:
            self.draft_len = n                  # every verify step fed its committed tokens to the drafter
        if self.hybrid:
            self._snapshot(n)

    # -- internals -------------------------------------------------------------------------------------
    def _reuse(self, prompt: list[int], use_draft: bool) -> int:
        if not self.enabled:
            self.snaps.clear()
            return 0
        common = common_prefix(self.held, prompt)
        for s in [s for s in self.snaps if s > common]:
            del self.snaps[s]                   # their tokens diverge from the sequence the caches will hold
        limit = min(common, len(prompt) - 1)
        if use_draft:
            limit = min(limit, self.draft_len)
        if not self.hybrid:
            return max(limit, 0) if not use_draft or self._ring_intact(limit) else 0
        r = max((s for s in self.snaps if s <= limit), default=0)
        if use_draft and not self._ring_intact(r):
            r = 0
        if r:
            self.snaps.move_to_end(r)
            self.cache.restore(self.snaps[r])
        return r

    def _ring_intact(self, r: int) -> bool:
        """Whether the drafter's rows of the window before position r are all intact."""
        return r <= 0 or self.draft_ring is None or max(0, r + 1 - self.draft_ring[0]) >= self.draft_from

    def _ring_floor(self, top: int) -> int:
        """draft_from after a request that wrote draft rows of positions below `top` (from its reuse on)."""
        if self.draft_ring is None:
            return 0
        return max(self._draft_kept, top - self.draft_ring[1])

    def _turn_points(self, prompt: list[int], r: int) -> list[int]:
        """Positions in (r, P) of the last two turn starts: the prefill stops there for a snapshot."""
        if self.boundary_id is None:
            return []
        pts = [i for i in range(r + 1, len(prompt)) if prompt[i] == self.boundary_id]
        return pts[-2:]

    def _snapshot(self, length: int):
        if length in self.snaps:
            self.snaps.move_to_end(length)
            return
        need = self.cache.ssm.nbytes + self.cache.conv.nbytes
        if need > self.budget:
            return
        while self.snaps and self.snapshot_bytes + need > self.budget:
            self.snaps.popitem(last=False)
            self.evictions += 1
        self.snaps[length] = (self._copy(self.cache.ssm), self._copy(self.cache.conv))

    def _copy(self, t: torch.Tensor) -> torch.Tensor:
        if self.host and t.is_cuda:
            out = torch.empty(t.shape, dtype=t.dtype, device="cpu", pin_memory=True)
            return out.copy_(t)
        return t.clone()


class _Tracked:
    """A decode loop that records the tokens it yields; `close()` reports them to the prefix cache."""

    def __init__(self, pc: PrefixCache, steps, first: int, use_draft: bool, capacity: int):
        self.pc, self.steps, self.use_draft, self.capacity = pc, steps, use_draft, capacity
        self.generated = [int(first)]

    def __iter__(self):
        return self

    def __next__(self) -> list[int]:
        tokens = next(self.steps)
        self.generated += tokens
        return tokens

    def close(self):
        self.steps.close()
        self.pc._finish(self.generated, self.use_draft, self.capacity)
