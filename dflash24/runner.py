"""Fixed-shape forwards of the target: chunked prefill and the one-token decode step.

On CUDA the decode step is one CUDA-graph replay. Its inputs live in static device tensors, and the only
shape that varies with the context -- the number of KV rows attention reads -- is bucketed (powers of
two), with one graph per bucket captured on first use.
"""
from __future__ import annotations

import torch

from .models.layers import Step


def kv_bucket(rows: int, capacity: int, smallest: int = 256) -> int:
    """Smallest power-of-two bucket >= rows (at least `smallest`, at most the cache capacity)."""
    b = smallest
    while b < rows:
        b *= 2
    return min(b, capacity)


class TargetRunner:
    def __init__(self, model, cache, device: torch.device, use_graphs: bool, capture: tuple[int, ...] = ()):
        self.model, self.cache, self.device = model, cache, device
        self.capture = capture
        self.use_graphs = use_graphs and device.type == "cuda"
        self.capacity = cache.capacity
        self._ids = torch.zeros(1, dtype=torch.long, device=device)
        self._pos = torch.zeros(1, dtype=torch.long, device=device)
        self._graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor, torch.Tensor | None]] = {}
        self._pool = None

    @torch.inference_mode()
    def prefill(self, ids: torch.Tensor, start: int, chunk: int):
        """Run ids [T] at positions start.. in chunks; returns (logits of the last token [1, V], features [T, F] or None)."""
        feats, h = [], None
        if start == 0 and hasattr(self.cache, "reset"):
            self.cache.reset()                 # recurrent (DeltaNet) state: a new sequence starts from zero
        for s in range(0, ids.shape[0], chunk):
            part = ids[s:s + chunk]
            step = Step.sequential(start + s, part.shape[0], device=self.device)
            h, f = self.model(part, step, self.cache, self.capture)
            if f is not None:
                feats.append(f)
        return self.model.logits(h[-1:]), (torch.cat(feats) if feats else None)

    def _forward_one(self, rows: int):
        step = Step(self._pos, self._pos, rows)
        h, f = self.model(self._ids, step, self.cache, self.capture)
        return self.model.logits(h), f

    @torch.inference_mode()
    def decode(self, token: torch.Tensor, pos: int):
        """One token at position pos -> (logits [1, V], features [1, F] or None). token: [1] on device."""
        self._ids.copy_(token.view(1))
        self._pos.fill_(pos)
        rows = kv_bucket(pos + 1, self.capacity)
        if not self.use_graphs:
            return self._forward_one(rows)
        entry = self._graphs.get(rows)
        if entry is None:
            entry = self._capture(rows)
        graph, logits, feats = entry
        graph.replay()
        return logits, feats

    def _capture(self, rows: int):
        # Warm-up runs on a side stream with the real inputs (so the KV row it writes is correct), then capture.
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            self._forward_one(rows)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            logits, feats = self._forward_one(rows)
        self._pool = graph.pool()
        self._graphs[rows] = (graph, logits, feats)
        return self._graphs[rows]
