"""The memory planner (dflash24/plan.py) and `dflash24 fit`: exact cache/weight bytes against the real
allocations, the 27B budget of FACTS.md section 6, max_context, the CLI."""
from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as QT

from dflash24 import plan as P
from dflash24 import synth
from dflash24.cli import main
from dflash24.config import ConfigError, EngineConfig
from dflash24.gguf.reader import GGUFFile
from dflash24.models import load_target
from dflash24.quant.linear import DENSE_BELOW, QuantLinear
from dflash24.quant.packed import PACKED_TYPES, pack

GiB, MiB, KiB = P.GiB, P.MiB, P.KiB


@pytest.fixture(scope="module")
def tiny_qwen35(tmp_path_factory):
    return synth.write_preset("qwen35-tiny", str(tmp_path_factory.mktemp("plan") / "qwen35-tiny.gguf"))


@pytest.fixture(scope="module")
def shape27b():
    return P.ModelShape.from_qwen35(synth.QWEN35_27B)


def _weight_items(p: P.Plan, who: str = "target") -> dict[str, int]:
    return {i.name: i.bytes for i in p.items if i.group == "weights" and i.name.startswith(who)}


# ---- (a) caches equal what new_cache allocates ---------------------------------------------------
@pytest.mark.parametrize("kv,dtype", [("f32", torch.float32), ("bf16", torch.bfloat16), ("f16", torch.float16)])
def test_kv_item_equals_dense_cache(tiny_qwen2_gguf, kv, dtype):
    gf = GGUFFile(tiny_qwen2_gguf)
    model = load_target(gf, "cpu", torch.float32, max_positions=300)
    cache = model.new_cache(300, dtype, "cpu")
    p = P.plan(gf, ctx=300, cache_type_k=kv, cache_type_v=kv)
    assert p.item(f"KV cache ({kv}/{kv})").bytes == cache.nbytes
    assert not any(i.name.startswith("DeltaNet") for i in p.items)


@pytest.mark.parametrize("kv,dtype", [("f32", torch.float32), ("bf16", torch.bfloat16)])
def test_hybrid_cache_items_equal_new_cache(tiny_qwen35, kv, dtype):
    gf = GGUFFile(tiny_qwen35)
    model = load_target(gf, "cpu", torch.float32, max_positions=512)
    cache = model.new_cache(512, dtype, "cpu")
    p = P.plan(gf, ctx=512, cache_type_k=kv, cache_type_v=kv)
    kv_b = p.item(f"KV cache ({kv}/{kv})").bytes
    assert kv_b == cache.kv.nbytes
    state, conv = p.item("DeltaNet state (fp32)").bytes, p.item("DeltaNet conv window (fp32)").bytes
    assert state == cache.ssm.nbytes and conv == cache.conv.nbytes
    c = model.cfg
    assert state + conv == type(cache).state_nbytes(model.n_delta_layers, c.ssm_v_heads, c.ssm_k_dim, c.ssm_v_dim,
                                                     c.conv_dim, c.conv_kernel)
    scratch = p.item("speculative scratch (fp32)").bytes
    if hasattr(cache, "spec_raw"):                        # the cache holds the speculative scratch
        assert kv_b + state + conv + scratch == cache.nbytes
    else:
        assert kv_b + state + conv == cache.nbytes


# ---- (b) weights equal pack() / QuantLinear built independently -------------------------------
def _independent_weight_bytes(gf: GGUFFile, skip=()) -> tuple[int, int, int]:
    """(packed bytes via pack() on CPU, dense bf16 bytes via QuantLinear on CPU, fp32 vector bytes)."""
    packed = dense = vec = 0
    for t in gf.tensors.values():
        if t.name == "token_embd.weight" or t.name.startswith(skip):
            continue
        if len(t.shape) == 1 or t.name.endswith("ssm_conv1d.weight"):
            vec += 4 * t.n_elements
        elif t.qtype in PACKED_TYPES and t.n_elements >= DENSE_BELOW:
            raw = torch.from_numpy(np.ascontiguousarray(t.data))
            packed += pack(raw, t.qtype, t.shape[1]).nbytes
        else:
            dense += QuantLinear.from_gguf(t, "cpu", torch.bfloat16).nbytes
    return packed, dense, vec


def test_weight_items_equal_pack_tiny_qwen35(tiny_qwen35):
    gf = GGUFFile(tiny_qwen35)
    w = _weight_items(P.plan(gf, ctx=256))
    packed, dense, vec = _independent_weight_bytes(gf)
    assert packed > 0 and dense > 0                     # the tiny preset exercises both paths
    assert sum(b for n, b in w.items() if "packed" in n) == packed
    assert sum(b for n, b in w.items() if "dense bf16" in n) == dense
    assert w["target fp32 vectors"] == vec
    emb = gf.tensors["token_embd.weight"]
    assert w[f"target token_embd ({emb.qtype.name})"] == emb.n_bytes


def test_weight_items_real_default_model():
    from dflash24.default_model import DefaultModelError, default_model_path
    try:
        path = default_model_path()
    except DefaultModelError as e:
        pytest.skip(str(e))
    gf = GGUFFile(path)
    p = P.plan(gf, ctx=4096)
    w = _weight_items(p)
    packed, dense, vec = _independent_weight_bytes(gf)
    assert sum(b for n, b in w.items() if "packed" in n) == packed
    assert sum(b for n, b in w.items() if "dense bf16" in n) == dense
    assert w["target fp32 vectors"] == vec
    # packed Q4_0/Q5_0/Q8_0/Q6_K keep the file's bytes; only Q4_K/Q5_K grow by 4 B per 256 weights
    file_2d = sum(t.n_bytes for t in gf.tensors.values() if len(t.shape) == 2 and t.name != "token_embd.weight")
    assert 0 <= packed - file_2d < 0.01 * file_2d
    assert p.fits


def test_tied_output_is_a_second_copy(tmp_path):
    from conftest import write_tiny_qwen2_gguf
    path = write_tiny_qwen2_gguf(tmp_path / "tied.gguf", qtype="Q8_0", dim=256, ffn_dim=512, tied_output=True)
    gf = GGUFFile(path)
    assert "output.weight" not in gf.tensors
    emb = gf.tensors["token_embd.weight"]
    assert emb.qtype == QT.Q8_0 and emb.n_elements >= DENSE_BELOW
    w = _weight_items(P.plan(gf, ctx=64))
    packed, dense, vec = _independent_weight_bytes(gf)
    tied = pack(torch.from_numpy(np.ascontiguousarray(emb.data)), emb.qtype, emb.shape[1]).nbytes
    assert w["target Q8_0 packed"] == packed + tied
    assert w[f"target token_embd ({emb.qtype.name})"] == emb.n_bytes


# ---- (c) the 27B shape against FACTS.md section 6 -------------------------------------------------
def test_27b_budget_matches_facts(shape27b):
    p = P.plan(shape27b, ctx=131072)
    w = _weight_items(p)
    weights = sum(w.values())
    assert 15.4 * GiB <= weights <= 15.9 * GiB, weights / GiB
    assert abs(w["target token_embd (Q4_K)"] - 682 * MiB) < 1 * MiB
    assert p.item("KV cache (bf16/bf16)").bytes == 8 * GiB                    # 64 KiB/token at 128K
    assert P.kv_nbytes(16, 1, 4, 256, "bf16", "bf16") == 64 * KiB
    assert P.kv_nbytes(16, 1, 4, 256, "q8_0", "q8_0") == 34 * KiB           # FACTS section 5 table
    assert P.kv_nbytes(16, 1, 4, 256, "q4_0", "q4_0") == 18 * KiB
    assert P.kv_nbytes(16, 1, 4, 256, "tq3", "tq3") == 14 * KiB
    assert p.item("DeltaNet state (fp32)").bytes == 144 * MiB
    conv = p.item("DeltaNet conv window (fp32)").bytes
    assert conv == 48 * 3 * 10240 * 4                                      # 5.6 MiB in fp32 (3 MiB in bf16)
    assert 2 * MiB < conv < 6 * MiB
    # embedding on host: -682 MiB of device memory
    h = P.plan(shape27b, ctx=131072, embed_on_host=True)
    assert p.total - h.total == pytest.approx(w["target token_embd (Q4_K)"], rel=0.05)
    assert h.host_bytes == w["target token_embd (Q4_K)"]


def test_27b_drafter_formats(shape27b):
    cfg = P.zlab_27b_drafter_config()
    bf16 = P.DraftShape.from_config(cfg, "BF16")
    assert bf16.n_params() == pytest.approx(1.73e9, rel=0.01)
    sizes = {}
    for q in ("BF16", "Q8_0", "Q4_K"):
        p = P.plan(shape27b, P.DraftShape.from_config(cfg, q), ctx=4096)
        sizes[q] = sum(_weight_items(p, "draft").values())
    assert 3.1 * GiB < sizes["BF16"] < 3.4 * GiB
    assert 1.6 * GiB < sizes["Q8_0"] < 1.8 * GiB
    assert 0.85 * GiB < sizes["Q4_K"] < 1.0 * GiB
    p = P.plan(shape27b, bf16, ctx=4096)
    # one full layer of ctx + block rows, four sliding layers of a 3,072-row ring (window 2048)
    assert p.item("draft KV cache").bytes == (4096 + 16 + 4 * 3072) * 8 * 128 * 2 * 2
    assert p.settings["spec"] == "tree"                                    # the engine's default with a drafter


def test_draft_from_path_matches_config(tmp_path):
    from dflash24.models.drafter import make_random_drafter_dir
    cfg = replace(synth.QWEN35_TINY, vocab_size=synth.tiny_vocab_size())
    d = make_random_drafter_dir(tmp_path / "d", cfg, 2, head_dim=32, n_heads=4, n_kv_heads=2)
    ds = P.DraftShape.from_path(d, cfg.n_layers)
    assert ds.fmt == "safetensors" and ds.cfg.n_layers == 2
    shape = P.ModelShape.from_qwen35(cfg)
    p = P.plan(shape, ds, ctx=256)
    from dflash24.models.drafter import DFlashDrafter
    drafter = DFlashDrafter.from_pretrained(d, "cpu", torch.bfloat16)
    held = sum(b.numel() * b.element_size() for n, b in drafter.named_buffers()
               if n.endswith("weight") and b.dim() == 2)
    assert p.item("draft weights (bf16)").bytes == held
    assert p.item("draft KV cache").bytes == drafter.new_cache(256 + 16, torch.bfloat16, "cpu").nbytes


@pytest.mark.parametrize("kv", ["bf16", "q4_0", "tq3"])
def test_windowed_draft_cache_item_equals_new_cache(shape27b, kv):
    """The 27B drafter's four sliding layers keep rings (drafter.ring_rows): the plan's item is the bytes
    new_cache allocates, and far below five full-length layers at 131K."""
    from types import SimpleNamespace
    from dflash24.cache.kv import WindowedKVCache
    from dflash24.models.drafter import DFlashDrafter
    cfg = P.zlab_27b_drafter_config()
    p = P.plan(shape27b, P.DraftShape.from_config(cfg, "Q8_0"), ctx=131072, cache_type_k=kv, cache_type_v=kv)
    cache = DFlashDrafter.new_cache(SimpleNamespace(cfg=cfg), 131072 + 16, (kv, kv), "meta")
    assert isinstance(cache, WindowedKVCache) and cache.full.k.shape[0] == 1 and cache.rings.k.shape[:2] == (4, 3072)
    assert p.item("draft KV cache").bytes == cache.nbytes
    full_length = P.kv_nbytes(5, 131072 + 16, 8, 128, kv, kv)
    assert cache.nbytes < 0.23 * full_length


# ---- (d) max_context -------------------------------------------------------------------------
def test_max_context_monotone_and_tight(shape27b):
    table = P.max_context_table(shape27b, gpu_mem_bytes=24 * GiB)
    assert table["tq3"] >= table["q4_0"] >= table["q8_0"] >= table["bf16"] >= table["f32"] > 0
    assert table["bf16"] == table["f16"]
    for t in ("bf16", "q8_0", "tq3"):
        n = table[t]
        assert P.plan(shape27b, ctx=n, cache_type_k=t, cache_type_v=t).fits
        if n < shape27b.context_length:                   # else capped at the native context
            assert not P.plan(shape27b, ctx=n + 256, cache_type_k=t, cache_type_v=t).fits
    assert table["bf16"] < shape27b.context_length
    # without the fused kernel (SDPA math: score matrices, K/V expanded per head) less context fits
    assert P.max_context(shape27b, None, "bf16", attention="math") < table["bf16"]
    # nothing fits on a 12 GiB card with a 15.7 GiB target
    assert P.max_context(shape27b, None, "tq3", gpu_mem_bytes=12 * GiB) == 0


def test_plan_grows_with_ctx_and_budget(shape27b):
    d = P.DraftShape.from_config(P.zlab_27b_drafter_config())
    a = P.plan(shape27b, d, ctx=4096, spec="chain", prefill_chunk=512)
    b = P.plan(shape27b, d, ctx=8192, spec="chain", prefill_chunk=512)
    assert all(y.bytes >= x.bytes for x, y in zip(a.items, b.items))
    t = P.plan(shape27b, d, ctx=4096, spec="tree", ddtree_budget=22)
    t64 = P.plan(shape27b, d, ctx=4096, spec="tree", ddtree_budget=64)
    # tree node states, (budget + 1) x 48 x 128 x 128 x 4 = 3 MiB per node, only where the recurrent kernel runs
    # the tree (more than SPEC_CHUNK_MAX_T = 32 nodes; fewer take the speculative-step kernel, which needs none)
    scratch = a.item("speculative scratch (fp32)").bytes
    assert t.item("speculative scratch (fp32)").bytes == scratch
    assert t64.item("speculative scratch (fp32)").bytes - scratch == 65 * 3 * MiB
    assert t64.total > t.total


def test_quantized_kv_supported(shape27b):
    """q8_0 / q4_0 / tq3 exist in the engine now (cache/kvquant.py): no longer marked 'planned'."""
    for t in ("q8_0", "q4_0", "tq3"):
        p = P.plan(shape27b, ctx=4096, cache_type_k=t, cache_type_v="bf16")
        assert "planned" not in p.item(f"KV cache ({t}/bf16)").note
        assert P.kv_supported(t, "tq3")
    assert "planned, not yet supported" not in P.plan(shape27b, ctx=4096).item("KV cache (bf16/bf16)").note
    with pytest.raises(P.PlanError):
        P.plan(shape27b, ctx=4096, cache_type_k="q3_x")
    with pytest.raises(ConfigError):
        P.plan(shape27b, ctx=4096, spec="chain")                    # no drafter


def test_parse_size():
    assert P.parse_size("24GiB") == 24 * GiB
    assert P.parse_size("24GB") == 24 * 10 ** 9
    assert P.parse_size("23.4GiB") == int(23.4 * GiB)
    assert P.parse_size("24000MiB") == 24000 * MiB
    assert P.parse_size("24G") == 24 * GiB
    assert P.parse_size(1234) == 1234
    for bad in ("", "24 parsecs", "-3GiB", "GiB"):
        with pytest.raises(P.PlanError):
            P.parse_size(bad)


# ---- (e) the CLI and the engine check ----------------------------------------------------------
def test_fit_json_parses(capsys):
    rc = main(["fit", "--target-preset", "qwen35-27b", "--ctx", "8192", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["plan"]["fits"] is True
    assert out["plan"]["total_bytes"] == sum(i["bytes"] for i in out["plan"]["items"])
    assert out["max_context"]["tq3"] >= out["max_context"]["bf16"] > 8192


def test_fit_default_model_text(capsys):
    from dflash24.default_model import DefaultModelError, default_model_path
    try:
        default_model_path()
    except DefaultModelError as e:
        pytest.skip(str(e))
    rc = main(["fit", "--gpu-mem", "24GiB"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "verdict: FITS" in out and "largest context per KV type" in out


def test_fit_not_fitting_exits_nonzero(capsys):
    rc = main(["fit", "--target-preset", "qwen35-27b", "--draft-preset", "dflash-27b", "--ctx", "65536",
               "--gpu-mem", "24GiB"])
    cap = capsys.readouterr()
    assert rc == 1
    assert "DOES NOT FIT" in cap.out and "to make it fit" in cap.out
    assert "lower --ctx to" in cap.out and "Q8_0 GGUF drafter" in cap.out
    assert "does not fit" in cap.err and "target Q4_K packed" in cap.err


def test_engine_check_refuses_on_small_gpu(tiny_qwen35, monkeypatch):
    gf = GGUFFile(tiny_qwen35)
    cfg = EngineConfig(model=tiny_qwen35, ctx=4096, device="cpu")
    assert P.check_engine(cfg, gf, torch.device("cpu")) is None          # CPU: skipped
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (1 * MiB, 24 * GiB))
    with pytest.raises(ConfigError) as e:
        P.check_engine(cfg, gf, torch.device("cuda"))
    assert "DOES NOT FIT" in str(e.value) and "KV cache" in str(e.value)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (8 * GiB, 24 * GiB))
    p = P.check_engine(cfg, gf, torch.device("cuda"))
    assert p.fits and p.item("CUDA context").bytes == 0
    assert p.settings["prefill_chunk"] == 4096 and p.settings["prefill_chunk_auto"]    # room for the largest
    assert P.check_engine(replace(cfg, prefill_chunk=300), gf, torch.device("cuda")).settings["prefill_chunk"] == 300
    # a smaller card emulated with torch.cuda.set_per_process_memory_fraction: the cap, not the driver's free memory
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (100 * GiB, 140 * GiB))
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)

    def fraction_of(value):            # torch's getter wants a device index (an index-less "cuda" raises)
        def get(device):
            assert torch.device(device).index == 0
            return value
        return get

    monkeypatch.setattr(torch.cuda, "get_per_process_memory_fraction", fraction_of(0.05), raising=False)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 1 * GiB)
    assert P.cuda_budget(torch.device("cuda")) == int(0.05 * 140 * GiB) - GiB
    monkeypatch.setattr(torch.cuda, "get_per_process_memory_fraction", fraction_of(0.001), raising=False)
    with pytest.raises(ConfigError):                                     # 0.14 GiB - 1 GiB: nothing left
        P.check_engine(cfg, gf, torch.device("cuda"))
    monkeypatch.setattr(torch.cuda, "get_per_process_memory_fraction", fraction_of(1.0), raising=False)
    assert P.cuda_budget(torch.device("cuda")) == 100 * GiB
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (1 * MiB, 24 * GiB))
    monkeypatch.setenv("DFLASH24_SKIP_FIT_CHECK", "1")
    assert P.check_engine(cfg, gf, torch.device("cuda")) is None


@pytest.mark.parametrize("attention", ["fused", "math"])
def test_prefill_scratch_stays_within_the_planned_activations(shape27b, tiny_qwen35, attention):
    """A prefill chunk of m rows under a plan made for T rows, plus the large-M matmul's scratch of (T - m) *
    prefill_row_bytes (quant.kernels.scratch_plan), never needs more than the plan's layer peak for T rows."""
    dense = P.ModelShape.from_gguf(GGUFFile(synth.write_preset("qwen2-tiny", str(tiny_qwen35) + ".dense.gguf")))
    for shape in (shape27b, P.ModelShape.from_gguf(GGUFFile(tiny_qwen35)), dense):
        row = P.prefill_row_bytes(shape.dim, shape.ffn_dim)
        assert row > 0
        for T in (512, 4096):
            full, _ = P._layer_peak(shape, T, 8192, P.ACT_BYTES, attention)
            for m in (1, 65, 200, T // 2, T - 1, T):
                part, _ = P._layer_peak(shape, m, 8192, P.ACT_BYTES, attention)
                assert part + (T - m) * row <= full, (shape.name, T, m)


def test_auto_prefill_chunk_is_the_largest_that_fits(shape27b):
    """No --prefill-chunk: the plan takes the largest of PREFILL_CHUNKS (capped at ctx) that fits the GPU, and
    when none fits, reports the smallest; an explicit chunk is kept as given."""
    fixed = {c: P.plan(shape27b, ctx=16384, prefill_chunk=c) for c in P.PREFILL_CHUNKS}
    assert all(not p.settings["prefill_chunk_auto"] for p in fixed.values())
    totals = [fixed[c].total for c in sorted(P.PREFILL_CHUNKS)]
    assert totals == sorted(totals) and totals[0] < totals[-1]
    big = P.plan(shape27b, ctx=16384, gpu_mem_bytes=40 * GiB)
    assert big.settings["prefill_chunk"] == 4096 and big.settings["prefill_chunk_auto"] and big.fits
    assert "prefill chunk 4096 (auto)" in P.format_plan(big)
    assert P.plan(shape27b, ctx=1500, gpu_mem_bytes=40 * GiB).settings["prefill_chunk"] == 1500
    for c in (2048, 1024, 512):                      # just enough memory for chunk c, not for the next larger one
        mem = fixed[c].total
        p = P.plan(shape27b, ctx=16384, gpu_mem_bytes=mem)
        assert p.fits and p.settings["prefill_chunk"] == c and p.total == mem
    tight = P.plan(shape27b, ctx=16384, gpu_mem_bytes=fixed[512].total - MiB)
    assert not tight.fits and tight.settings["prefill_chunk"] == 512
    assert any("lower --ctx" in a for a in P.advice(tight, shape27b))
    # the table's largest context: some chunk fits there, none at the next step
    n = P.max_context(shape27b, None, "bf16", gpu_mem_bytes=24 * GiB)
    assert P.plan(shape27b, ctx=n, gpu_mem_bytes=24 * GiB).fits
    assert not P.plan(shape27b, ctx=n + 256, gpu_mem_bytes=24 * GiB, prefill_chunk=512).fits


def test_engine_resolves_the_prefill_chunk(tiny_qwen35):
    from dflash24.engine import Engine, resolve_prefill_chunk
    eng = Engine(EngineConfig(model=tiny_qwen35, ctx=256, device="cpu"))
    assert eng.config.prefill_chunk == P.CPU_PREFILL_CHUNK                # CPU: no plan
    p = P.plan(GGUFFile(tiny_qwen35), ctx=3000, gpu_mem_bytes=8 * GiB)
    assert resolve_prefill_chunk(EngineConfig(ctx=3000), p).prefill_chunk == 3000
    assert resolve_prefill_chunk(EngineConfig(prefill_chunk=64), p).prefill_chunk == 64


def test_prefill_runs_under_the_plans_scratch_allowance(tiny_qwen35, monkeypatch):
    """TargetRunner.prefill gives the large-M matmul the plan's chunk (capped at the cache's rows) and the model's
    prefill_row_bytes for each of its forwards, and takes them back after."""
    from dflash24.engine import Engine
    from dflash24.quant import kernels
    eng = Engine(EngineConfig(model=tiny_qwen35, ctx=256, device="cpu"))
    cfg, seen = eng.model.cfg, []
    forward = type(eng.model).forward

    def recording(self, *a, **kw):
        seen.append(kernels.SCRATCH_PLAN)
        return forward(self, *a, **kw)
    monkeypatch.setattr(type(eng.model), "forward", recording)
    ids = torch.arange(1, 41)
    eng.runner.prefill(ids, 0, 16)
    row = P.prefill_row_bytes(cfg.dim, cfg.ffn_dim)
    assert seen == [(16, row)] * 3 and kernels.SCRATCH_PLAN == (0, 0)       # 40 tokens in chunks of 16
    eng.runner.prefill(ids, 0, 4096)
    assert seen[-1] == (eng.cache.capacity, row) and kernels.SCRATCH_PLAN == (0, 0)


def test_batch_invariant_mode_plans_the_split_partials(tiny_qwen2_gguf, monkeypatch):
    """DFLASH24_BATCH_INVARIANT=1 merges up to MAX_SPLITS attention partials for every step of <= 64 tokens:
    the plan adds them (and only in that mode)."""
    from dflash24.quant import kernels
    gf = GGUFFile(tiny_qwen2_gguf)
    base = P.plan(gf, ctx=256, prefill_chunk=64)
    assert not any(i.name == "activations: attention split partials" for i in base.items)
    monkeypatch.setattr(kernels, "BATCH_INVARIANT", True)
    p = P.plan(gf, ctx=256, prefill_chunk=64)
    c = load_target(gf, "cpu", torch.float32, max_positions=256).cfg
    assert p.item("activations: attention split partials").bytes == 64 * 64 * c.n_heads * (c.head_dim + 2) * 4
    assert p.total > base.total


def test_low_bit_k_note_for_k_bias_models(tmp_path, shape27b):
    """A model with k_proj biases (qwen2 layout) gets the low-bit K note for q4_0 / tq3 K, not for q8_0 K or low-bit
    V; the 27B (qwen35: normed keys, no bias) never does. tq3 on a head dim it cannot hold is refused up front."""
    from conftest import write_tiny_qwen2_gguf
    qwen2 = str(write_tiny_qwen2_gguf(tmp_path / "q2.gguf", dim=128, n_heads=4))       # head dim 32

    def noted(target, k, v="bf16"):
        return any("k_proj bias" in n for n in P.plan(target, ctx=256, cache_type_k=k, cache_type_v=v).notes)
    assert noted(qwen2, "q4_0")
    assert not noted(qwen2, "q8_0") and not noted(qwen2, "q8_0", "q4_0")
    assert not noted(shape27b, "q4_0") and not noted(shape27b, "tq3")
    with pytest.raises(P.PlanError, match="multiple of 128"):
        P.plan(qwen2, ctx=256, cache_type_k="tq3")
    table = P.max_context_table(qwen2, gpu_mem_bytes=24 * GiB)
    assert table["tq3"] is None and table["q4_0"] > 0 and "multiple of 128" in P.kv_type_error(qwen2, None, "tq3")
