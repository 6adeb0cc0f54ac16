"""Short prompts prefilled as the decode loop's verify steps (a chain block, or a tree laid out as a chain) whose
real tokens are all committed (`TargetRunner._prefill_tiles`, CUDA-graph replays on a GPU): the same logits,
features, DeltaNet state, conv window and KV rows as the eager chunked prefill, for prompts that end inside a tile,
span several, and continue earlier ones; and which prompts take that path."""
from __future__ import annotations

import pytest
import torch

from dflash24 import runner as runner_mod
from dflash24 import synth
from dflash24.gguf.reader import GGUFFile
from dflash24.models import load_target
from dflash24.quant import kernels as quant_kernels
from dflash24.runner import TargetRunner

CAPACITY = 256


@pytest.fixture(scope="module")
def models(tiny_qwen2_gguf, tmp_path_factory):
    q35 = synth.write_preset("qwen35-tiny", str(tmp_path_factory.mktemp("tiles") / "tiny.gguf"))
    return {name: load_target(GGUFFile(str(path)), torch.device("cpu"), torch.float32, CAPACITY)
            for name, path in (("qwen35", q35), ("qwen2", tiny_qwen2_gguf))}


def _runner(model, tile: tuple[str, int] | None) -> TargetRunner:
    cache = model.new_cache(CAPACITY, torch.float32, "cpu", max_spec_tokens=32, max_tree_nodes=32)
    r = TargetRunner(model, cache, torch.device("cpu"), False, capture=(0, 1))
    r.tile = tile                                     # the graph path, run eagerly
    return r


def _kv(cache):
    kv = getattr(cache, "kv", cache)
    return kv.k, kv.v


@pytest.mark.parametrize("arch", ["qwen35", "qwen2"])
@pytest.mark.parametrize("tile", [("chain", 16), ("tree", 23)])
@pytest.mark.parametrize("segments", [[1], [7], [16], [17], [45], [100], [128], [30, 5, 64, 16]])
def test_tile_prefill_equals_eager_prefill(models, arch, tile, segments):
    model = models[arch]
    vocab = model.cfg.vocab_size
    ids = torch.randint(0, vocab, (sum(segments) + 4,), generator=torch.Generator().manual_seed(len(segments)))
    runs = {}
    for tiles in (False, True):
        r = _runner(model, tile if tiles else None)
        feats, logits, start = [], [], 0
        for n in segments:
            assert bool(r.prefill_tile_count(n, start)) == tiles
            logits.append(r.prefill(ids[start:start + n], start, 64,
                                    lambda f, s: feats.append((s, f.clone()))).clone())
            start += n
        for j in range(4):                             # decode continues from the committed state
            out, _ = r.decode(ids[start + j:start + j + 1], start + j)
            logits.append(out.clone())
        runs[tiles] = (torch.cat(logits), feats, r.cache, start + 4)
    (eager, f_eager, c_eager, total), (tiled, f_tiled, c_tiled, _) = runs[False], runs[True]
    torch.testing.assert_close(tiled, eager, rtol=0, atol=1e-4)
    assert eager.abs().max() > 0
    # the features each prompt row gave the drafter: the same rows at the same positions
    rows = lambda fs: torch.cat([f for _, f in fs])        # noqa: E731
    assert [s for s, _ in f_tiled][0] == 0 and rows(f_tiled).shape == rows(f_eager).shape
    torch.testing.assert_close(rows(f_tiled), rows(f_eager), rtol=0, atol=1e-4)
    for a, b in zip(_kv(c_tiled), _kv(c_eager)):
        torch.testing.assert_close(a[:, :total], b[:, :total], rtol=0, atol=1e-4)
    if arch == "qwen35":
        # fp32 rounding at the state's scale: its entries reach ~400 here, and eager prefills in chunks of 64 and
        # of 1 token differ by ~1e-6 of the largest
        scale = c_eager.ssm.abs().max()
        assert scale > 0
        torch.testing.assert_close(c_tiled.ssm, c_eager.ssm, rtol=0, atol=1e-5 * scale)
        torch.testing.assert_close(c_tiled.conv, c_eager.conv, rtol=1e-4, atol=1e-5)


def test_which_prompts_take_the_tiles(models, monkeypatch):
    r = _runner(models["qwen35"], ("tree", 23))
    count = r.prefill_tile_count                                            # tiles of 23
    assert count(100, 0) == 5 and count(23, 0) == 1 and count(1, 0) == 1
    assert count(runner_mod.TILE_PREFILL_MAX, 0) == 6
    assert count(runner_mod.TILE_PREFILL_MAX + 1, 0) == 0                  # longer: eager chunks
    assert count(10, CAPACITY - 23) == 1
    assert count(10, CAPACITY - 22) == 0                   # a tile's rows would pass the end of the cache
    assert count(0, 0) == 0
    assert _runner(models["qwen35"], ("chain", 16)).prefill_tile_count(40, 0) == 3              # tiles of 16
    assert _runner(models["qwen35"], None).prefill_tile_count(10, 0) == 0    # graphs off, or AR without room
    monkeypatch.setattr(quant_kernels, "BATCH_INVARIANT", True)
    assert r.prefill_tile_count(10, 0) == 0
    monkeypatch.setattr(quant_kernels, "BATCH_INVARIANT", False)
    monkeypatch.setattr(runner_mod, "TILE_PREFILL_MAX", 0)
    assert r.prefill_tile_count(10, 0) == 0


@pytest.mark.parametrize("spec,tile", [("ar", None), ("chain", ("chain", 16)), ("tree", ("tree", 9))])
def test_engine_prefills_short_prompts_as_its_verify_step(tiny_qwen2_gguf, tmp_path, spec, tile):
    """The engine picks its mode's verify shape (the runner gets it only where graphs run: not on this CPU), and
    generation after a tiled prefill (forced here, run eagerly) equals generation after the eager one."""
    from dflash24.config import EngineConfig, SamplingParams
    from dflash24.engine import Engine
    from dflash24.models.drafter import make_random_drafter_dir
    draft = None
    if spec != "ar":
        cfg = load_target(GGUFFile(str(tiny_qwen2_gguf)), torch.device("cpu"), torch.float32, 64).cfg
        draft = str(make_random_drafter_dir(tmp_path / "d", cfg, 2, dtype=torch.float32, target_layer_ids=(0, 1)))
    eng = Engine(EngineConfig(model=str(tiny_qwen2_gguf), draft=draft, ctx=256, device="cpu", spec=spec,
                              ddtree_budget=8))
    assert eng.prefill_tile(eng.drafter) == tile and eng.runner.tile is None
    prompt = eng.encode_raw("def add(a, b):")
    outs = []
    for forced in (None, tile):
        eng.runner.tile = forced
        eng.prefix.forget()
        outs.append([t for ev in eng.generate(prompt, SamplingParams(max_tokens=24, ignore_eos=True))
                     for t in ev.token_ids])
    assert len(outs[0]) == 24 and outs[0] == outs[1]


def test_tile_limit_from_the_environment():
    """DFLASH24_TILE_PREFILL_MAX sets the limit at import; a value that is not a token count fails with a clear
    message."""
    import os
    import subprocess
    import sys

    def run(value):
        return subprocess.run([sys.executable, "-c", "import dflash24.runner as r; print(r.TILE_PREFILL_MAX)"],
                              capture_output=True, text=True, env={**os.environ, "DFLASH24_TILE_PREFILL_MAX": value})
    assert run("0").stdout.strip() == "0" and run("256").stdout.strip() == "256"
    bad = run("-1")
    assert bad.returncode != 0 and "DFLASH24_TILE_PREFILL_MAX must be a number of tokens" in bad.stderr


def test_ar_mode_takes_its_own_tiles_only_where_the_plan_leaves_room(tiny_qwen2_gguf, monkeypatch):
    """AR mode has no verify graph: it prefills short prompts as chain steps of engine.AR_TILE tokens only on CUDA
    with graphs, under a memory plan with engine.AR_TILE_FREE_BYTES free (the decision alone; nothing runs)."""
    import dataclasses
    from types import SimpleNamespace

    from dflash24 import engine as engine_mod
    from dflash24.config import EngineConfig
    eng = engine_mod.Engine(EngineConfig(model=str(tiny_qwen2_gguf), ctx=256, device="cpu"))
    assert eng.spec_mode == "ar" and eng.runner.tile is None and not eng._ar_tile_fits()      # CPU
    eng.device = torch.device("cuda")
    for free, fits in ((engine_mod.AR_TILE_FREE_BYTES, True), (engine_mod.AR_TILE_FREE_BYTES - 1, False)):
        eng.plan = SimpleNamespace(free=free)
        assert eng._ar_tile_fits() == fits
        assert eng.prefill_tile(None) == (("chain", engine_mod.AR_TILE) if fits else None)
    eng.config = dataclasses.replace(eng.config, cuda_graphs=False)
    assert not eng._ar_tile_fits()
    eng.config = dataclasses.replace(eng.config, cuda_graphs=True)
    monkeypatch.setattr(runner_mod, "TILE_PREFILL_MAX", 0)
    assert not eng._ar_tile_fits()
    monkeypatch.undo()
    eng.plan = None                                   # DFLASH24_SKIP_FIT_CHECK=1: no plan, no tiles
    assert not eng._ar_tile_fits()


def test_quantized_kv_content_check_runs_on_the_first_real_prompt(tmp_path):
    """A quantized KV cache checks each layer's content loss on the first prompt chunk of >= PROBE_MIN_ROWS rows;
    graph replays would skip that check, so such a prompt prefills eagerly, and tiles take the prompts after it."""
    from conftest import write_tiny_qwen2_gguf
    from dflash24.cache.kv import PROBE_MIN_ROWS
    path = write_tiny_qwen2_gguf(tmp_path / "hd32.gguf", dim=128)                 # 4 heads of 32
    model = load_target(GGUFFile(str(path)), torch.device("cpu"), torch.float32, CAPACITY)
    cache = model.new_cache(CAPACITY, (torch.float32, "q8_0"), "cpu", max_spec_tokens=32)
    r = TargetRunner(model, cache, torch.device("cpu"), False)
    r.tile = ("chain", 16)
    ids = torch.randint(0, model.cfg.vocab_size, (60,), generator=torch.Generator().manual_seed(9))
    assert r.prefill_tile_count(PROBE_MIN_ROWS - 1, 0) == 1        # too short to be checked either way
    assert r.prefill_tile_count(40, 0) == 0 and not cache.content_errors
    r.prefill(ids[:40], 0, 64)
    assert {side for side, _ in cache.content_errors} == {"V"}      # checked, on the eager prefill
    assert r.prefill_tile_count(20, 40) == 2
