"""Static KV cache for the attention layers of one sequence.

Buffers are allocated once at the planned capacity; a step writes its keys/values at `step.slots`
(index_copy_, CUDA-graph safe) and attention reads rows 0..kv_rows-1.

K and V each have their own type: a dense torch dtype (buffer [n_layers, capacity, Hk, D]) or a quantized
format of cache/kvquant.py, 'q8_0' | 'q4_0' | 'tq3' (uint8 buffer [n_layers, capacity, Hk, row_bytes]),
encoded at `write`. `layer()` then returns a `PackedKV` for that side, which attention decodes (the SDPA
path dequantizes the visible rows; the Triton kernel decodes tiles in registers). Packed rows are
self-contained, so moving rows (`commit`) is the same byte copy as for dense rows.
"""
from __future__ import annotations

import contextlib
import logging

import torch

from .kvquant import (DENSE_TYPES, QUANT_TYPES, PackedKV, centroids, check_type, content_error, encode, rotation,
                      rotation_signs, row_bytes)

log = logging.getLogger("dflash24")
# A quantized side whose first prompt chunk loses more than this (content_error) in some layer draws one warning:
# on Qwen2.5-Coder-1.5B (k_proj bias outliers) q4_0 / tq3 K measure 3.8 / 10.5 in layer 0 and break the model,
# q8_0 0.34 does not (0.5B: q4_0 1.56, q8_0 0.16); 1.0 = every content value rounded away.
CONTENT_ERROR_WARN = 0.75
PROBE_MIN_ROWS = 16


def _resolve(t) -> torch.dtype | str:
    """A KV side's type: a torch dtype, a dense name ('bf16', 'f16', 'f32') or a quantized format name."""
    if isinstance(t, torch.dtype):
        return t
    if t in DENSE_TYPES:
        return DENSE_TYPES[t]
    if t in QUANT_TYPES:
        return t
    raise ValueError(f"unknown KV cache type {t!r} (known: {', '.join((*DENSE_TYPES, *QUANT_TYPES))}, or a torch dtype)")


class KVCache:
    def __init__(self, n_layers: int, capacity: int, n_kv_heads: int, head_dim: int,
                 dtype=torch.bfloat16, device=None, k_type=None, v_type=None):
        """dtype: a torch dtype for both sides, or a (k_type, v_type) pair; k_type / v_type override it."""
        if isinstance(dtype, tuple):
            dtype, pair = None, dtype
        else:
            pair = (dtype, dtype)
        self.k_type = _resolve(k_type if k_type is not None else pair[0])
        self.v_type = _resolve(v_type if v_type is not None else pair[1])
        self.capacity, self.head_dim = capacity, head_dim
        self.k = self._alloc(n_layers, capacity, n_kv_heads, head_dim, self.k_type, device)
        self.v = self._alloc(n_layers, capacity, n_kv_heads, head_dim, self.v_type, device)
        # layers whose quantized sides have not been checked yet (first write of >= PROBE_MIN_ROWS rows)
        self._unprobed = set(range(n_layers)) if isinstance(self.k_type, str) or isinstance(self.v_type, str) \
            else set()
        self.content_errors: dict[tuple[str, int], float] = {}
        self._warned: set[str] = set()

    @staticmethod
    def _alloc(n_layers, capacity, n_kv_heads, head_dim, t, device) -> torch.Tensor:
        if isinstance(t, torch.dtype):
            return torch.zeros(n_layers, capacity, n_kv_heads, head_dim, dtype=t, device=device)
        check_type(t, head_dim)
        if t == "tq3":          # build the constant tensors now: a CUDA graph capturing a step cannot
            rotation(device)    # copy them from the host later
            rotation_signs(device)
            centroids(device)
        return torch.zeros(n_layers, capacity, n_kv_heads, row_bytes(t, head_dim), dtype=torch.uint8,
                           device=device)

    def region(self, start: int, n: int) -> "KVCache":
        """A cache over rows start .. start+n-1 of this one, sharing its storage (batched generation packs one
        sequence per region: each prefills through its region, and the batched decode reads them all)."""
        if not 0 <= start < start + n <= self.capacity:
            raise ValueError(f"region {start}..{start + n - 1} outside the cache's {self.capacity} rows")
        view = object.__new__(KVCache)
        view.k_type, view.v_type, view.capacity, view.head_dim = self.k_type, self.v_type, n, self.head_dim
        view.k, view.v = self.k[:, start:start + n], self.v[:, start:start + n]
        view._unprobed, view.content_errors, view._warned = set(), self.content_errors, self._warned
        return view

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes

    @staticmethod
    def _encode(x: torch.Tensor, t) -> torch.Tensor:
        return x.to(t) if isinstance(t, torch.dtype) else encode(x, t)

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
        """k, v: [T, Hk, D] written at rows `slots` of layer `layer` (quantized sides are encoded here)."""
        if layer in self._unprobed and k.shape[0] >= PROBE_MIN_ROWS:
            self._probe(layer, k, v)
        self.k[layer].index_copy_(0, slots, self._encode(k, self.k_type))
        self.v[layer].index_copy_(0, slots, self._encode(v, self.v_type))

    def dense_layer(self, layer: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(K rows, V rows) of one layer, each [capacity, Hk, D], for a kernel that writes a step's rows itself (the
        fused q / k norm + rotary + write: kernels/rope.py); None when a side is quantized (`write` encodes it)."""
        if not (isinstance(self.k_type, torch.dtype) and isinstance(self.v_type, torch.dtype)):
            return None
        return self.k[layer], self.v[layer]

    def probe_pending(self, rows: int) -> bool:
        """Whether an eager write of `rows` rows would still check a layer's quantized content (`_probe`)."""
        return bool(self._unprobed) and rows >= PROBE_MIN_ROWS

    @contextlib.contextmanager
    def no_probe(self):
        """Writes inside this block are not checked (warm-up on dummy tokens: their rows have no content)."""
        pending, self._unprobed = self._unprobed, set()
        try:
            yield
        finally:
            self._unprobed = pending

    def _probe(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        """Once per layer, on its first prompt chunk (never inside a CUDA-graph capture: it reads a number back):
        how much content each quantized side loses; one warning naming the layer and a safer type."""
        if k.is_cuda and torch.cuda.is_current_stream_capturing():
            return
        self._unprobed.discard(layer)
        for side, x, t in (("K", k, self.k_type), ("V", v, self.v_type)):
            if not isinstance(t, str):
                continue
            err = content_error(x, t)
            self.content_errors[(side, layer)] = err
            if err > CONTENT_ERROR_WARN and side not in self._warned:
                self._warned.add(side)
                better = "q8_0" if t != "q8_0" else "bf16"
                log.warning("%s cache %s loses this model's %s content in layer %d (error %.1fx the content, measured "
                            "on the first prompt chunk; outlier channels such as Qwen2.5's k_proj biases set the "
                            "block scales): expect wrong output; use --cache-type-%s %s",
                            side, t, side, layer, err, side.lower(), better)

    def _view(self, buf: torch.Tensor, t):
        return buf if isinstance(t, torch.dtype) else PackedKV(buf, t, self.head_dim)

    def layer(self, layer: int):
        """(K, V) of one layer: each a dense [capacity, Hk, D] tensor or a PackedKV."""
        return self._view(self.k[layer], self.k_type), self._view(self.v[layer], self.v_type)

    def commit(self, step, path: torch.Tensor, base: int):
        """Keep the accepted tokens of a speculative step: token path[j] of `step` (written at row
        step.slots[path[j]]) becomes row base + j. A chain (step.parents is None) wrote its tokens at
        base, base+1, ... already, and its accepted tokens are a prefix: nothing to move."""
        if step.parents is None:
            return
        src = step.slots[path]
        dst = torch.arange(base, base + path.shape[0], device=src.device)
        self.k[:, dst] = self.k[:, src]
        self.v[:, dst] = self.v[:, src]


class WindowedKVCache:
    """The KV rows of a model whose sliding-window layers see only their last `window` positions (the DFlash
    drafter of Qwen3.6-27B: four of its five layers): full layers keep a row per position (`capacity` rows),
    sliding layers a ring of `ring` rows, position p at row p % ring. At 131,072 positions that is 3,072 rows
    a sliding layer instead of 131,088.

    The ring must hold a step's whole view (window + block) plus every row written ahead of the committed
    context (a step's scratch rows, the padding of a context update) before a visible row is overwritten:
    `drafter.ring_rows` sizes it. Layers keep their model indices: `write` / `layer` route them."""

    def __init__(self, sliding: tuple[bool, ...], capacity: int, ring: int, n_kv_heads: int, head_dim: int,
                 dtype=torch.bfloat16, device=None):
        if not any(sliding) or ring < 1:
            raise ValueError("a windowed cache needs at least one sliding layer and a ring of at least one row")
        full = [i for i, s in enumerate(sliding) if not s]
        rings = [i for i, s in enumerate(sliding) if s]
        self.full = KVCache(len(full), capacity, n_kv_heads, head_dim, dtype, device) if full else None
        self.rings = KVCache(len(rings), ring, n_kv_heads, head_dim, dtype, device)
        self._where = {i: (self.full, j) for j, i in enumerate(full)}
        self._where.update({i: (self.rings, j) for j, i in enumerate(rings)})
        self.capacity, self.ring = capacity, ring

    @property
    def nbytes(self) -> int:
        return self.rings.nbytes + (self.full.nbytes if self.full is not None else 0)

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
        """As KVCache.write. A sliding layer's rows go to slots % ring; of more rows than the ring holds (a prompt
        chunk, in position order) only the last `ring` are written (one write per row: index_copy_ with repeated
        indices has no defined order)."""
        cache, j = self._where[layer]
        if cache is self.rings:
            if k.shape[0] > self.ring:
                slots, k, v = slots[-self.ring:], k[-self.ring:], v[-self.ring:]
            slots = torch.remainder(slots, self.ring)
        cache.write(j, slots, k, v)

    def layer(self, layer: int):
        cache, j = self._where[layer]
        return cache.layer(j)
