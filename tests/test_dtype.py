"""The activation dtype: the CLI's `auto` (bfloat16 on CUDA and on CPUs with native bf16, else float32, the exact
reference path), and a whole engine on the CPU in bfloat16."""
from __future__ import annotations

import pytest
import torch

from dflash24 import config
from dflash24.cli import build_parser, engine_config
from dflash24.config import ConfigError, EngineConfig, SamplingParams, cpu_has_bf16
from dflash24.engine import Engine

X86 = "processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512bw {}avx512_vnni\n"
ARM = "processor\t: 0\nFeatures\t: fp asimd {}i8mm\n"


def test_cpu_has_bf16_reads_the_flags():
    assert cpu_has_bf16(X86.format("avx512_bf16 "))
    assert cpu_has_bf16(X86.format("amx_bf16 amx_tile "))
    assert not cpu_has_bf16(X86.format(""))
    assert cpu_has_bf16(ARM.format("bf16 "))
    assert not cpu_has_bf16(ARM.format("sve "))
    assert not cpu_has_bf16("model name\t: a bf16 in a name is not a flag\n")


@pytest.mark.parametrize("native", [True, False])
def test_auto_dtype(monkeypatch, native):
    monkeypatch.setattr(config, "cpu_has_bf16", lambda: native)
    assert EngineConfig(device="cpu", dtype="auto").torch_dtype() == (torch.bfloat16 if native else torch.float32)
    assert EngineConfig(device="cpu").torch_dtype() == torch.float32              # the API's default: exact
    assert EngineConfig(device="cuda", dtype="auto").torch_dtype() == torch.bfloat16
    assert EngineConfig(device="cpu", dtype="float16").torch_dtype() == torch.float16
    with pytest.raises(ConfigError, match="--dtype must be auto, float32"):
        EngineConfig(dtype="int8")


def test_cli_passes_the_dtype():
    assert engine_config(build_parser().parse_args(["run", "hi"])).dtype == "auto"
    assert engine_config(build_parser().parse_args(["run", "--dtype", "float32", "hi"])).dtype == "float32"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["run", "--dtype", "fp8", "hi"])


def _float_bytes(model) -> int:
    return sum(t.numel() * t.element_size() for t in list(model.parameters()) + list(model.buffers())
               if t.is_floating_point())


def test_bfloat16_model_holds_half_the_bytes(tiny_qwen2_gguf):
    """On the CPU the matrices are dequantized once at load, to the activation dtype: in bfloat16 a token reads
    half the bytes (only small tables, e.g. the rotary ones, stay float32)."""
    from dflash24.engine import Engine
    f32, bf16 = (Engine(EngineConfig(model=str(tiny_qwen2_gguf), ctx=64, device="cpu", dtype=d)).model
                 for d in ("float32", "bfloat16"))
    assert _float_bytes(bf16) <= 0.55 * _float_bytes(f32), (_float_bytes(bf16), _float_bytes(f32))


@pytest.mark.parametrize("spec", ["ar", "chain", "tree"])
def test_engine_in_bfloat16_on_the_cpu(tiny_qwen2_gguf, tmp_path, spec):
    """Every mode runs in bfloat16 on the CPU and commits the tokens asked for."""
    from dflash24.engine import Engine
    from dflash24.models.drafter import make_random_drafter_dir
    draft = None
    if spec != "ar":
        cfg = Engine(EngineConfig(model=str(tiny_qwen2_gguf), ctx=64, device="cpu")).model.cfg
        draft = str(make_random_drafter_dir(tmp_path / "d", cfg, 1, dtype=torch.float32, target_layer_ids=(0,)))
    eng = Engine(EngineConfig(model=str(tiny_qwen2_gguf), draft=draft, spec=spec, ctx=128, device="cpu",
                              dtype="bfloat16"))
    events = list(eng.generate([5, 6, 7, 8], SamplingParams(max_tokens=20, ignore_eos=True)))
    tokens = [t for e in events for t in e.token_ids]
    assert len(tokens) == 20 and all(0 <= t < eng.model.cfg.vocab_size for t in tokens)
    assert events[-1].stats.as_dict()["mode"] == spec


@pytest.mark.parametrize("device,message", [
    ("xyz", "--device 'xyz' is not a device"), ("mps", "--device 'mps': dflash24 runs on cpu or cuda"),
    ("cuda:99", "--device 'cuda:99': PyTorch sees")])
def test_engine_refuses_a_device_it_cannot_use(tiny_qwen2_gguf, device, message):
    """Before anything loads; naming cuda stays fine for configs that only plan (`dflash24 fit` on any machine)."""
    with pytest.raises(ConfigError, match=message):
        Engine(EngineConfig(model=str(tiny_qwen2_gguf), device=device))
    assert EngineConfig(device="cuda").kv_types()


@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine without CUDA")
def test_cuda_on_a_machine_without_it(tiny_qwen2_gguf):
    with pytest.raises(ConfigError, match="PyTorch sees no CUDA device .* use --device cpu"):
        Engine(EngineConfig(model=str(tiny_qwen2_gguf), device="cuda"))
