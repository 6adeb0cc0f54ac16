"""The GPU benchmark scripts run end to end on a tiny qwen35 on the CPU, so a GPU session never finds one
broken: benchmarks/bench_long_context.py (random drafter written as a GGUF and loaded through EngineConfig.draft,
tree-mode long run, AR decode-at runs, planner report) and benchmarks/bench_prefix.py (cold / rechunked /
warm / later-turn answers)."""
from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tiny35(tmp_path_factory) -> str:
    from dflash24.synth import write_preset
    return write_preset("qwen35-tiny", str(tmp_path_factory.mktemp("bench") / "tiny35.gguf"), seed=5)


def _script(name: str):
    """A benchmark script imported as a module (benchmarks/ on the path while it loads: its own imports)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))


def _run(script: str, *args: str) -> tuple[int, list[dict]]:
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), *args], capture_output=True,
                          text=True, timeout=600, cwd=ROOT)
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert lines, proc.stderr[-2000:]
    return proc.returncode, lines


def test_bench_long_context_on_cpu(tiny35, tmp_path):
    rc, lines = _run("bench_long_context.py", tiny35, "--device", "cpu", "--kv", "q4_0", "--ctx", "1024",
                     "--draft-type", "Q8_0", "--work", str(tmp_path), "--gen", "8", "--decode-at", "300")
    rep = lines[-1]
    assert rc == 0 and rep["errors"] == {}, rep
    assert [x["stage"] for x in lines[:-1]] == ["drafter written", "loaded", "long"]
    assert Path(lines[0]["path"]).is_file() and lines[0]["path"].endswith("_Q8_0.gguf")
    assert rep["planned_fits"] and rep["planned_total_GiB"] > 0 and "KV cache (q4_0/q4_0)" in rep["plan"]
    assert rep["engine_prefill_chunk"] == 512 and rep["planned_prefill_chunk"] == 1024      # CPU: no plan, 512
    assert rep["long"]["spec"] == "tree" and rep["long"]["prompt"] == 1024 - 8
    assert rep["decode_at_300"]["spec"] == "ar" and rep["decode_at_300"]["steady_decode_tokens_per_s"] > 0
    rc, lines = _run("bench_long_context.py", tiny35, "--device", "cpu", "--ctx", "1024", "--draft-type", "Q4_K",
                     "--work", str(tmp_path), "--prepare")
    assert rc == 0 and [x.get("stage") for x in lines] == ["drafter written"]


def test_bench_prefill_attention_on_cpu():
    """Every KV type and a tile config of its own, on tiny shapes in the interpreter: a row per type, the config's
    output equal to the default's, SDPA's within bf16 rounding of it."""
    rc, lines = _run("bench_prefill_attention.py", "--device", "cpu", "--heads", "4", "--kv-heads", "2",
                     "--head-dim", "128", "--chunk", "8", "--contexts", "40",
                     "--configs", '[{"BLOCK_M": 16, "BLOCK_N": 16, "num_warps": 4, "num_stages": 1}]',
                     "--segments", "0,16")
    assert rc == 0 and lines[0]["device"] == "cpu"
    rows = lines[1:]
    assert [r["kv"] for r in rows] == ["bf16", "q8_0", "q4_0", "tq3"]
    for r in rows:
        assert r["context"] == 40 and r["ms"] > 0 and r["configs"][0]["max_diff"] <= 2e-2, r
        if r["kv"] != "bf16":     # the quantized tiles and 16-row segments against the default
            assert [s["segment_rows"] for s in r["segments"]] == [0, 16], r
            assert all(s["max_diff"] <= 2e-2 for s in r["segments"]), r
    assert rows[0]["sdpa_lower_right"]["max_diff"] <= 2e-2


def test_ab_steps_on_cpu(tiny35):
    """The one-process A/B of code policies runs every policy, in the order asked, and refuses unknown ones."""
    rc, lines = _run("ab_steps.py", tiny35, "--device", "cpu", "--ctx", "256", "--pos", "40", "--iters", "2",
                     "--order", "new,old,embed_only,gate_only,tree_index_only,gate_copied,gate_in_place,gate_pad,"
                     "ahead2,regs96,dot_pairs,q4k_ffn32_128,sums_norms_512,spec16,spec_before,waves1.5,new")
    assert rc == 0 and [x.get("policy") for x in lines[1:]] == ["new", "old", "embed_only", "gate_only",
                                                                "tree_index_only", "gate_copied", "gate_in_place",
                                                                "gate_pad", "ahead2", "regs96", "dot_pairs",
                                                                "q4k_ffn32_128", "sums_norms_512", "spec16",
                                                                "spec_before", "waves1.5", "new"]
    assert all(x["ar_ms"] > 0 and x["verify16_ms"] > 0 and x["tree23_ms"] > 0 for x in lines[1:])
    script = str(ROOT / "benchmarks" / "ab_steps.py")
    proc = subprocess.run([sys.executable, script, tiny35, "--order", "new,bogus"], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)
    assert proc.returncode == 2 and "unknown policies ['bogus']" in proc.stderr


def test_bench_prefix_on_cpu(tiny35):
    rc, lines = _run("bench_prefix.py", tiny35, "--device", "cpu", "--history", "400", "--ctx", "1024", "--gen", "6")
    rep = lines[-1]
    assert rc == 0 and rep["identical_answers"] and rep["cold_vs_cold_half_chunks_identical"], rep
    assert rep["cold"]["prefilled"] == rep["turn2_prompt_tokens"]
    assert 0 < rep["warm"]["reused"] < rep["turn2_prompt_tokens"] and rep["warm_turn3"]["reused"] > rep["warm"]["reused"]


def test_diag_verify_numerics_on_cpu(tiny35):
    """On the CPU, one-token decode steps and 8-token blocks give the same logits bit for bit (the script's
    GPU use is to measure how far apart the two paths are there)."""
    rc, lines = _run("diag_verify_numerics.py", tiny35, "--device", "cpu", "--tokens", "24", "--prompts", "2",
                     "--block", "8")
    assert rc == 0 and len(lines) == 2
    for rep in lines:
        assert rep["tokens"] == 24 and rep["greedy_flips"] == 0 and rep["max_logit_diff"] == 0.0, rep


def test_draft_formats_quality_on_cpu(tmp_path):
    """benchmarks/draft_formats_quality.py: a drafter trained here, quantized to each format, compared with
    its BF16 self on the target's own continuations of the shipped prompts."""
    from conftest import write_tiny_qwen2_gguf
    from dflash24.train.data import Sequence
    from dflash24.train.trainer import TrainConfig, Trainer
    target = write_tiny_qwen2_gguf(tmp_path / "t.gguf", n_layers=3, dim=256, ffn_dim=512, n_heads=4, seed=3)
    g = torch.Generator().manual_seed(0)
    seqs = [Sequence(torch.randint(0, 260, (48,), generator=g).tolist(), 8) for _ in range(4)]
    tr = Trainer(TrainConfig(model=str(target), out=str(tmp_path / "d"), layers=1, block=8, anchors=16, max_len=64,
                             device="cpu", progress=False, steps=3, warmup=0.0), seqs)
    tr.fit()
    tr.export()
    rc, lines = _run("draft_formats_quality.py", str(target), str(tmp_path / "d"), "--prompts", "1", "--gen", "24",
                     "--anchor", "8")
    assert rc == 0 and [x["format"] for x in lines] == ["BF16", "Q8_0", "Q6_K", "Q4_K"]
    assert lines[0]["cos_min"] == 1.0 and lines[0]["top1_vs_bf16"] == 1.0 and lines[0]["positions"] > 0
    assert all(x["cos_mean"] > 0.9 for x in lines)


def test_tune_gemv_markdown_is_issue_2s_table():
    """tune_gemv.py --markdown turns its JSON lines into issue #2's table: each type a row, each shape a column, the
    GEMV's us and copy-bandwidth fraction, then the engine's M = 16 / 23 ratios (the tl.dot kernel's in brackets
    only where they differ), a failed shape's error in its cell."""
    tune_gemv = _script("tune_gemv")
    head = {"copy_GBps": 4237.5, "device": "NVIDIA H200"}
    small = {16: {"engine": [28.2, 1.68], "dot": [37.9, 2.26]}, 23: {"engine": [37.6, 2.24], "dot": [52.8, 3.15]}}
    same = {16: {"engine": [30.0, 2.0], "dot": [30.0, 2.0]}, 23: {"engine": [40.0, 2.5], "dot": [40.0, 2.5]}}
    rows = [{"qtype": "Q4_K", "N": 17408, "K": 5120, "default": [16.76, 0.727], "small_m": small},
            {"qtype": "Q4_K", "N": 5120, "K": 17408, "error": "OutOfMemoryError: CUDA out of memory"},
            {"qtype": "Q8_0", "N": 17408, "K": 5120, "default": [25.34, 0.873], "small_m": same}]
    lines = tune_gemv.markdown(head, rows).splitlines()
    assert "4,237.5 GB/s (NVIDIA H200)" in lines[0]
    assert lines[2] == "| type | 17408x5120 | 5120x17408 |" and lines[3] == "|---|---|---|"
    assert lines[4] == ("| Q4_K | 16.76 us, 72.7 %; 1.68x / 2.24x (2.26x / 3.15x) | "
                        "OutOfMemoryError: CUDA out of memory |")
    assert lines[5] == "| Q8_0 | 25.34 us, 87.3 %; 2.00x / 2.50x | - |"
    assert len(lines) == 6


def test_ttgir_counts_loads_in_flight():
    """ttgir_counts.py's measure of how far ahead a loop's global loads are issued: each LDG from its issue to the
    first instruction (around the loop) reading one of its destination registers (a .128 load writes four), not
    one that only writes them."""
    ttgir_counts = _script("ttgir_counts")
    loop = [("IDP.4A.S8.S8", " R20, R9, R13, R20"),       # reads R9: the second load's, issued last trip
            ("LDG.E.128.CONSTANT", " R4, desc[UR4][R2.64]"),
            ("MOV", " R7, RZ"),                           # writes R7 only
            ("IMAD", " R8, R6, R3, RZ"),                  # reads R6: the first load's use, 2 after it
            ("LDG.E", " R9, desc[UR4][R2.64+0x10]"),
            ("BRA", " 0x40")]
    assert ttgir_counts.global_loads_in_flight(loop) == {"ldg_a_trip": 2, "ldg_in_flight_mean": round(4 / 6, 1),
                                                         "ldg_distance_mean": 2.0, "ldg_distance_min": 2}
    assert ttgir_counts.global_loads_in_flight(loop[2:4]) == {}


def test_probe_read_pattern_reads_every_word_once():
    """probe_read_pattern.py's layouts: each program reads its two rows' words, each once, where its layout puts
    them (the xors equal the PyTorch reference's over `offsets`; CPU interpreter, 3 steps a row), every layout
    covers the whole plane once, the tensor-descriptor read reads the `rows` words, and the chunk read covers it
    too."""
    P = _script("probe_read_pattern")
    n, row_words = 6, 3 * P.STEP_WORDS
    src = torch.randint(-2**31, 2**31 - 1, (n * row_words,), dtype=torch.int32)
    for order in P.ORDERS:
        assert torch.equal(P.offsets(n, row_words, order).flatten().sort().values, torch.arange(src.numel())), order
        out = torch.zeros(n // 2, dtype=torch.int32)
        P.read_rows(src, out, n, row_words, order)
        assert torch.equal(out, P.reference(src, n, row_words, order)), order
    for stages in (1, 3):           # the tensor-descriptor read (the interpreter runs the loop unpipelined)
        out = torch.zeros(n // 2, dtype=torch.int32)
        P.read_tdesc(P.triton_descriptor(src, n, row_words), out, n, row_words, stages)
        assert torch.equal(out, P.reference(src, n, row_words, "rows")), stages
    assert not torch.equal(P.reference(src, n, row_words, "steps"), P.reference(src, n, row_words, "rows"))
    big = torch.randint(-2**31, 2**31 - 1, (4096,), dtype=torch.int32)
    out = torch.zeros(4, dtype=torch.int32)
    P.read_chunks(big, out, per=1024)                   # 4 programs of 1024 words: 2 rows of 512, program-major
    assert torch.equal(out, P.reference(big, 8, 512, "pairs"))
    with pytest.raises(ValueError, match="row_words a multiple"):
        P.read_rows(src, out, n, row_words - 1, "rows")
    with pytest.raises(ValueError, match="per a multiple of 1024"):
        P.read_chunks(src, out, per=1152)


_RING_COMPILE = r"""
import json, sys
import torch, triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource
from triton.runtime.jit import mangle_type
sys.path.insert(0, sys.argv[1])
import probe_read_pattern as P
out, lay = [], P.gluon_layouts()
cases = [("ring", 90, 2), ("ring", 90, 8), ("ring", 86, 4), ("tma", 90, 2), ("tma", 90, 4)]
for kind, arch, slots in cases:
    fn = P._ring_kernel if kind == "ring" else P._tma_kernel
    const = {"S": slots, "STEP": P.STEP_WORDS, **(lay if kind == "ring" else {"L": lay["L"]})}
    if kind == "ring":
        sig = {"src_ptr": "*i32"}
    else:
        desc = P.tma_descriptor(torch.zeros(16 * P.STEP_WORDS, dtype=torch.int32), 4, 4 * P.STEP_WORDS)
        sig = {"desc": mangle_type(desc)}
    sig.update({"out_ptr": "*i32", "row_words": "i32", **{k: "constexpr" for k in const}})
    src = GluonASTSource(fn=fn, signature=sig, attrs={(fn.arg_names.index(k),): [["tt.divisibility", 16]]
                                                      for k in sig if k in ("src_ptr", "out_ptr", "row_words")},
                         constexprs={(fn.arg_names.index(k),): v for k, v in const.items()})
    ptx = triton.compile(src, target=GPUTarget("cuda", arch, 32), options=dict(num_warps=1)).asm["ptx"]
    out.append(dict(kind=kind, slots=slots, cp=ptx.count("cp.async.cg"), bulk=ptx.count("cp.async.bulk.tensor"),
                    wait_group=ptx.count("cp.async.wait_group"), local=ptx.count(".local")))
from triton.compiler import ASTSource
desc = P.triton_descriptor(torch.zeros(16 * P.STEP_WORDS, dtype=torch.int32), 4, 4 * P.STEP_WORDS)
for stages in (1, 3):
    sig = {"desc": mangle_type(desc), "out_ptr": "*i32", "row_words": "i32", "STEP": "constexpr",
           "STAGES": "constexpr"}
    ptx = triton.compile(ASTSource(P._tdesc_kernel, sig, {"STEP": P.STEP_WORDS, "STAGES": stages}),
                         target=GPUTarget("cuda", 90, 32), options=dict(num_warps=1, num_stages=stages)).asm["ptx"]
    out.append(dict(kind="tdesc", slots=stages, cp=ptx.count("cp.async.cg"), bulk=ptx.count("cp.async.bulk.tensor"),
                    wait_group=0, local=ptx.count(".local")))
print(json.dumps(out))
"""


def test_probe_read_pattern_gluon_rings_compile():
    """The probe's Gluon reads, compiled for sm_90 (and the cp.async ring for sm_86) with no GPU: the cp.async ring
    issues two 16-byte copies a lane a step (S - 1 steps in the prologue, one a trip), the TMA ring one bulk tensor
    copy a step, and Triton pipelines the tensor-descriptor read into TMA copies too; none spills. Their values are
    checked on the GPU against the reference (the probe's `ok`)."""
    P = _script("probe_read_pattern")
    if not P.HAVE_GLUON:
        pytest.skip("triton without Gluon")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-c", _RING_COMPILE, str(ROOT / "benchmarks")], capture_output=True,
                          text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for r in json.loads(proc.stdout.strip().splitlines()[-1]):
        if r["kind"] == "ring":
            assert r["cp"] == 2 * r["slots"] and r["bulk"] == 0 and r["wait_group"] >= 2, r
        else:                       # the Gluon TMA ring, and Triton's own pipelining of the descriptor read
            assert r["bulk"] == r["slots"] and r["cp"] == 0, r
        assert r["local"] == 0, r
    src = torch.zeros(4 * P.STEP_WORDS, dtype=torch.int32)
    out = torch.zeros(2, dtype=torch.int32)
    with pytest.raises(ValueError, match="2\\+ slots"):
        P.read_ring(src, out, 4, P.STEP_WORDS, 1)
    with pytest.raises(ValueError, match="row_words a multiple"):
        P.read_tma(None, out, 4, P.STEP_WORDS + 1, 4)


def test_bench_spec_random_drafter_as_gguf(tiny35):
    """bench_spec's --draft-type: the random drafter written as a GGUF of that block type and loaded as a user's
    would be: its matrices QuantLinear layers of that type (packed for the block kernels on a GPU; dequantized once
    on the CPU), within Q8_0's rounding of the dense drafter's same random weights (half a step of a block's max /
    127, plus up to 127 times the fp16 rounding of that step: 0.6 of a step), everything else the same values."""
    bench_spec = _script("bench_spec")
    from dflash24.config import EngineConfig
    from dflash24.engine import Engine
    from dflash24.quant.linear import QuantLinear
    eng = Engine(EngineConfig(model=tiny35, ctx=256, device="cpu", dtype="float32"))
    dense = bench_spec.attach_random_drafter(eng, 1, 256, "chain", "cpu", torch.float32)
    assert not any(isinstance(m, QuantLinear) for m in dense.modules())
    q8 = bench_spec.attach_random_drafter(eng, 1, 256, "chain", "cpu", torch.float32, draft_type="Q8_0")
    packed = [m for m in q8.modules() if isinstance(m, QuantLinear)]
    assert packed and all(m.qtype.name == "Q8_0" for m in packed)
    a_bufs, b_bufs = dict(dense.named_buffers()), dict(q8.named_buffers())
    assert a_bufs.keys() == b_bufs.keys() and any(v.dim() == 2 and "blk." in k for k, v in a_bufs.items())
    for name, a in a_bufs.items():
        b = b_bufs[name]
        assert a.shape == b.shape, name
        if name.endswith(".weight") and a.dim() == 2:          # the matrices: Q8_0 blocks of 32
            step = a.reshape(-1, 32).abs().amax(1, keepdim=True) / 127
            assert ((a.reshape(-1, 32) - b.reshape(-1, 32)).abs() <= step * 0.6).all(), name
            assert not torch.equal(a, b), name
        else:
            assert torch.equal(a, b), name


def test_profile_grid_table_lists_the_underfilled_launches(monkeypatch):
    """profile_steps.py --grids: per kernel, launches a step, programs a launch (min / max), threads and the trace's
    occupancy estimate from a Kineto trace's kernel events (other events ignored), sorted by time; the kernels with
    a launch of fewer programs than SMs listed as underfilled."""
    from dflash24.kernels import pdl
    monkeypatch.setattr(pdl, "ENABLED", pdl.ENABLED)         # the script switches PDL off at import: restored after
    mod = _script("profile_steps")
    ev = lambda name, dur, grid, block=(128, 1, 1), **a: dict(  # noqa: E731
        cat="kernel", name=name, dur=dur, args=dict(grid=list(grid), block=list(block), **a))
    trace = {"traceEvents": [
        ev("_sum_partials_kernel", 2.0, (80, 1, 1)), ev("_sum_partials_kernel", 3.0, (160, 1, 1)),
        ev("_kq_kernel", 40.0, (66, 4, 1), **{"est. achieved occupancy %": 19, "registers per thread": 168}),
        dict(ev("_rms_norm_kernel", 4.0, (16, 3, 1), block=(256, 1, 1)), cat="Kernel"),
        dict(cat="cuda_runtime", name="cudaLaunchKernel", dur=9.0, args={}),
    ]}
    t = mod._grid_table(trace, steps=1, sms=132, top=10)
    assert [k["name"] for k in t["kernels"]] == ["_kq_kernel", "_sum_partials_kernel", "_rms_norm_kernel"]
    kq, sums, norm = t["kernels"]
    assert (kq["programs_min"], kq["programs_max"], kq["occupancy_pct"], kq["registers"]) == (264, 264, [19], [168])
    assert (sums["launches"], sums["us"], sums["programs_min"], sums["programs_max"]) == (2, 5.0, 80, 160)
    assert norm["threads"] == [256] and norm["programs_max"] == 48
    assert [k["name"] for k in t["underfilled"]] == ["_sum_partials_kernel", "_rms_norm_kernel"]
    half = mod._grid_table(trace, steps=2, sms=132, top=1)
    assert half["kernels"][0]["us"] == 20.0 and len(half["underfilled"]) == 1


def test_kernel_table_sums_cuda_kernels_per_step():
    """bench_spec.kernel_table (profile_steps.py, bench_prefill.py): CUDA events only, summed per name and per step,
    the top names by time with their share."""
    from types import SimpleNamespace
    kernel_table = _script("bench_spec").kernel_table
    cuda, cpu = torch.autograd.DeviceType.CUDA, torch.autograd.DeviceType.CPU
    events = [SimpleNamespace(device_type=cuda, name="gemv", device_time=30.0),
              SimpleNamespace(device_type=cuda, name="gemv", device_time=50.0),
              SimpleNamespace(device_type=cuda, name="norm", device_time=20.0),
              SimpleNamespace(device_type=cpu, name="aten::mm", device_time=999.0)]
    t = kernel_table(SimpleNamespace(events=lambda: events), 2, 1)
    assert t == {"kernel_us_per_step": 50.0, "kernels_per_step": 1.5,
                 "top": [{"name": "gemv", "calls": 1.0, "us": 40.0, "share": 0.8}]}


def test_probe_kv_sides_runs_every_case_on_cpu(capsys):
    """benchmarks/probe_kv_sides.py (Triton's interpreter, tiny shapes): each K / V pair, step and split count runs
    through the attention kernel to a finite output, and --rotations runs tq3's two rotations per step, as torch ops
    and as the attention's one-launch `rotate_groups`."""
    _script("probe_kv_sides").main(["--device", "cpu", "--heads", "2", "--kv-heads", "1", "--head-dim", "128",
                                    "--ctx", "96", "--steps", "1,4", "--pairs", "q4_0:q4_0,bf16:q4_0,q8_0:bf16",
                                    "--splits", "1,2", "--rotations"])
    lines = capsys.readouterr().out.split("\n")[:-1]
    assert len(lines) == 3 * (1 + 3) + 2 * 4 and all(line.split()[-1] == "ran" for line in lines), lines
    names = [f"rotate {x} ({way})" for way in ("torch ops", "rotate_groups") for x in ("q", "output back")]
    assert [line.rsplit(" ", 2)[0] for line in lines[-8:]] == names * 2, lines
