"""The frozen target's side of drafter training, computed once: features and greedy next tokens on disk.

Every epoch runs the target over every training sequence for the same result: its hidden states at
`target_layer_ids` (the drafter's context) and, for `labels="target"`, its greedy next token. For a big target
that forward is most of a step. `FeatureCache` keeps both in flat memory-mapped files under one directory:

    manifest.json   what the files hold: the target file's sha256, the captured layers, the dtype, the width, a
                    digest of the training sequences, and each sequence's offset (in tokens)
    features.bin    [total tokens, width] in the target's activation dtype (bf16 on a GPU, fp32 on the CPU)
    next.bin        [total tokens] int32: the target's greedy token after each prefix (labels="target" only)
    done.bin        [sequences] uint8: 1 once a sequence's rows are on disk (`sync`, at every checkpoint: a killed
                    run keeps what it synced and recomputes the rest)

A cache built for another target, other layers, another dtype or other sequences is refused by name.
Disk: tokens x width x 2 bytes in bf16 (the 0.5B with 3 captured layers: 5.3 KiB a token; a 27B with 5: 50 KiB).
"""
from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import torch

from .data import TrainDataError, read_manifest

_NP = {torch.bfloat16: np.uint16, torch.float32: np.float32, torch.float16: np.float16}


class FeatureCacheError(TrainDataError):
    """A feature cache directory this run cannot use (another run's, unreadable, or no disk for it)."""


def sequences_digest(seqs) -> str:
    """sha256 over every sequence's token ids (the cache is only valid for exactly these sequences)."""
    h = hashlib.sha256()
    for s in seqs:
        h.update(np.asarray(s.ids, dtype=np.int64).tobytes())
        h.update(b"|")
    return h.hexdigest()


class FeatureCache:
    def __init__(self, root, *, target_sha256: str, layers: tuple[int, ...], dtype: torch.dtype, width: int,
                 seqs, with_next: bool):
        if dtype not in _NP:
            raise FeatureCacheError(f"feature cache: unsupported dtype {dtype}")
        self.root, self.dtype, self.width, self.with_next = Path(root), dtype, width, with_next
        lengths = [len(s.ids) for s in seqs]
        self.offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        want = {"target_sha256": target_sha256, "layers": list(layers), "dtype": str(dtype).replace("torch.", ""),
                "width": width, "sequences": len(seqs), "tokens": int(self.offsets[-1]),
                "sequences_sha256": sequences_digest(seqs), "next_tokens": with_next}
        self.root.mkdir(parents=True, exist_ok=True)
        man = self.root / "manifest.json"
        if man.is_file():
            have = read_manifest(man, "feature-cache manifest", "delete the directory or use another --feature-cache",
                                 FeatureCacheError)
            diff = [f"{k}: {have.get(k)!r} here, {v!r} now" for k, v in want.items() if have.get(k) != v]
            if diff:
                raise FeatureCacheError(f"{self.root}: a feature cache of another run ({'; '.join(diff[:3])}); "
                                        f"use another --feature-cache directory")
        else:
            man.write_text(json.dumps(want, indent=1))
        T = int(self.offsets[-1])
        self._check_disk(T * width * np.dtype(_NP[dtype]).itemsize + (T * 4 if with_next else 0))
        self.feats = self._map("features.bin", _NP[dtype], (T, width))
        self.next = self._map("next.bin", np.int32, (T,)) if with_next else None
        self.done = self._map("done.bin", np.uint8, (len(seqs),))
        self.unsynced: set[int] = set()                      # written this run, not yet marked done on disk

    def _check_disk(self, nbytes: int):
        """The files are sparse: a full disk would only show as a crash (SIGBUS) on a later write, so refuse
        up front when the free space cannot hold what is not written yet."""
        held = sum(p.stat().st_blocks * 512 for p in (self.root / "features.bin", self.root / "next.bin")
                   if p.exists())
        free = shutil.disk_usage(self.root).free
        if nbytes - held > free:
            raise FeatureCacheError(f"{self.root}: the feature cache needs {(nbytes - held) / 2**30:.2f} GiB more "
                                    f"disk, {free / 2**30:.2f} GiB are free (fewer sequences, --max-len, or "
                                    f"another directory)")

    def _map(self, name: str, dtype, shape):
        path = self.root / name
        nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
        if not path.exists() or path.stat().st_size != nbytes:
            with open(path, "wb") as f:                      # sparse: the disk fills as rows are written
                f.truncate(nbytes)
        return np.memmap(path, dtype=dtype, mode="r+", shape=shape)

    def has(self, i: int) -> bool:
        return i in self.unsynced or bool(self.done[i])

    def get(self, i: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(features [T, width] in the cache dtype, next tokens [T] int64 or None) of sequence i, on the CPU."""
        a, b = int(self.offsets[i]), int(self.offsets[i + 1])
        f = torch.from_numpy(np.array(self.feats[a:b]))
        if self.dtype == torch.bfloat16:
            f = f.view(torch.bfloat16)
        nxt = torch.from_numpy(np.array(self.next[a:b])).long() if self.next is not None else None
        return f, nxt

    def put(self, i: int, feats: torch.Tensor, nxt: torch.Tensor | None):
        a, b = int(self.offsets[i]), int(self.offsets[i + 1])
        if tuple(feats.shape) != (b - a, self.width):
            raise FeatureCacheError(f"sequence {i}: features {tuple(feats.shape)}, expected {(b - a, self.width)}")
        f = feats.detach().to("cpu", self.dtype).contiguous()
        self.feats[a:b] = (f.view(torch.int16).numpy().view(np.uint16) if self.dtype == torch.bfloat16
                           else f.numpy())
        if self.next is not None:
            self.next[a:b] = nxt.detach().cpu().numpy().astype(np.int32)
        self.unsynced.add(i)

    def sync(self):
        """Write the rows put since the last sync to disk, then mark their sequences done (one msync per file,
        not one per sequence)."""
        if not self.unsynced:
            return
        self.feats.flush()
        if self.next is not None:
            self.next.flush()
        self.done[sorted(self.unsynced)] = 1                 # only after the rows are on disk
        self.done.flush()
        self.unsynced.clear()
