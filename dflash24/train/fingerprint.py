"""sha256 of target files, without rehashing big files on every start.

The packaged models (dflash24.default_model) are sha256-checked when assembled, so a path to their
assembled file with the right size returns the known hash. Any other file is hashed once; the result is
cached in `<cache_dir>/sha256-cache.json` keyed by absolute path, mtime_ns and size.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path


def _hash(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def target_sha256(path, cache_file: Path | None = None) -> str:
    from ..default_model import QWEN25_CODER_05B, QWEN25_CODER_15B, cache_dir
    p = Path(path).resolve()
    st = p.stat()
    for m in (QWEN25_CODER_05B, QWEN25_CODER_15B):
        if p == (cache_dir() / m.filename).resolve() and st.st_size == m.size:
            return m.sha256
    cache_file = cache_file or cache_dir() / "sha256-cache.json"
    key = f"{p}|{st.st_mtime_ns}|{st.st_size}"
    try:
        cache = json.loads(cache_file.read_text())
    except (OSError, ValueError):
        cache = {}
    if not isinstance(cache, dict):
        cache = {}
    if key in cache:
        return cache[key]
    digest = _hash(p)
    cache = {k: v for k, v in cache.items() if not k.startswith(f"{p}|")}
    cache[key] = digest
    try:
        cache_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache_file.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(cache, indent=0))
        tmp.replace(cache_file)
    except OSError as e:                      # a read-only cache only costs a rehash next time
        logging.getLogger("dflash24").debug("sha256 cache not written (%s)", e)
    return digest
