"""Benchmark runner: shipped prompt suites, per-prompt/per-suite numbers, AR comparison, results.json."""
from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import io
import json
from importlib import resources
from pathlib import Path

import pytest

import dflash24
from dflash24.bench import SUITES, add_bench_args, benchmark, load_suite, parse_suites, run_bench, summarize
from dflash24.bench.runner import build_results
from dflash24.config import ConfigError, EngineConfig, SamplingParams
from dflash24.engine import Engine


@pytest.fixture(scope="module")
def engine(tiny_qwen2_gguf):
    return Engine(EngineConfig(model=str(tiny_qwen2_gguf), ctx=1024, device="cpu", cuda_graphs=False))


# -- datasets --------------------------------------------------------------------------------------------
def test_suites_ship_with_the_package_in_the_published_prompt_styles():
    data = resources.files("dflash24.bench").joinpath("data")
    assert Path(str(data)).resolve().is_relative_to(Path(dflash24.__file__).resolve().parent)
    for suite in SUITES:
        prompts = load_suite(suite)
        assert len(prompts) == 10 and len({p.id for p in prompts}) == 10
        assert all(p.suite == suite and p.id.startswith(suite) for p in prompts)
    he = load_suite("he")
    assert all("def " in p.text and '"""' in p.text and not p.text.startswith("Complete the") for p in he)
    assert he[0].text.startswith("from typing import List\n\ndef has_close_elements(")
    assert he[0].text.endswith('    """\n')
    gsm = load_suite("gsm")
    assert all(p.text.startswith("Question: ") and p.text.endswith("\nAnswer: ") for p in gsm)
    assert gsm[0].text.count("Question: ") == 1
    math = load_suite("math")
    assert all(p.text.startswith("Problem: ") and p.text.endswith("\nSolution: ") for p in math)
    assert not any("boxed" in p.text[-40:] for p in math)
    assert math[0].text == "Problem: Find the domain of the expression $\\frac{\\sqrt{x-2}}{\\sqrt{5-x}}$.\nSolution: "
    assert [p.id for p in load_suite("gsm", 3)] == [p.id for p in gsm[:3]]


def test_suite_names_are_checked():
    assert parse_suites(" he, math ") == ["he", "math"]
    with pytest.raises(ValueError, match="unknown --suite mmlu"):
        parse_suites("he,mmlu")
    with pytest.raises(ValueError, match="empty"):
        parse_suites(",")
    with pytest.raises(ValueError, match="unknown benchmark suite"):
        load_suite("nope")


# -- runner ----------------------------------------------------------------------------------------------
class SpecLike:
    """Stands in for a speculative engine: the real engine's tokens, reported under another mode and with
    two tokens committed per step, so the AR comparison path runs on CPU."""

    spec_mode = "chain"

    def __init__(self, engine):
        self.engine = engine

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def generate(self, prompt_ids, params, stop=(), cancelled=None):
        for ev in self.engine.generate(prompt_ids, params, stop, cancelled):
            if ev.stats is not None:
                n = ev.stats.completion_tokens
                ev.stats = dataclasses.replace(ev.stats, mode="chain", accept_hist={2: n // 2, 1: n % 2},
                                               steps=(n + 1) // 2, decode_s=ev.stats.decode_s / 2)
            yield ev


def test_ar_engine_runs_only_ar_and_writes_results(engine, tmp_path):
    asked, out = [], io.StringIO()

    def make_engine(mode):
        asked.append(mode)
        return engine

    res = benchmark(make_engine, ["he", "gsm"], n_prompts=2, max_tokens=12, out_dir=tmp_path, output=out)
    assert asked == [None]                                     # an AR engine needs no second run
    assert res["modes"] == ["ar"] and res["speedup_vs_ar"] == {}
    assert [r["id"] for r in res["prompts"]] == ["he_01", "he_02", "gsm_01", "gsm_02"]
    for r in res["prompts"]:
        assert 1 <= r["completion_tokens"] <= 12 and r["tokens_per_s"] > 0 and r["acceptance_length"] == 1.0
        assert r["mode"] == "ar" and r["finish_reason"] in ("stop", "length")
    # the run is greedy raw completion: the first prompt's output is the engine's own greedy continuation
    ids = engine.encode_raw(load_suite("he", 1)[0].text)
    expected = "".join(ev.text for ev in engine.generate(ids, SamplingParams(max_tokens=12)))
    assert res["prompts"][0]["text_head"] == expected[:160]
    he = res["suites"]["he"]["ar"]
    assert he["prompts"] == 2
    assert he["completion_tokens"] == sum(r["completion_tokens"] for r in res["prompts"][:2])
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["suites"] == res["suites"] and saved["max_tokens"] == 12 and saved["n_prompts"] == 2
    text = out.getvalue()
    assert "he_01" in text and "gsm_02" in text and "tok/s" in text and "AL" in text
    assert (tmp_path / "bench.png").exists() == (importlib.util.find_spec("matplotlib") is not None)


def test_speculative_engine_is_compared_with_ar_in_the_same_run(engine, tmp_path):
    asked = []

    def make_engine(mode):
        asked.append(mode)
        return SpecLike(engine) if mode is None else engine

    out = io.StringIO()
    res = benchmark(make_engine, ["math"], n_prompts=2, max_tokens=10, out_dir=tmp_path, output=out)
    assert asked == [None, "ar"]
    assert res["modes"] == ["chain", "ar"]
    spec, ar = res["suites"]["math"]["chain"], res["suites"]["math"]["ar"]
    assert res["speedup_vs_ar"]["math"]["chain"] == pytest.approx(spec["tokens_per_s"] / ar["tokens_per_s"], rel=1e-2)
    assert res["identical_to_ar"]["math"]["chain"] == {"identical": 2, "prompts": 2}
    assert 1.0 < spec["acceptance_length"] <= 2.0
    assert "x" in out.getvalue().split("speedup")[1]           # the ratio is printed in the summary
    assert "2/2" in out.getvalue()


def test_sampled_runs_seed_each_prompt_and_skip_the_token_comparison(engine, tmp_path):
    """--temperature > 0: prompt i samples with seed + i in every mode (the same seed gives the same text,
    another seed other text), the settings are recorded, and no identical-to-AR count is claimed."""
    seen = []

    def make_engine(mode):
        return SpecLike(engine) if mode is None else engine

    def run(seed):
        res = benchmark(make_engine, ["he"], n_prompts=2, max_tokens=16, output=io.StringIO(), warmup=0,
                        temperature=1.0, top_p=0.95, seed=seed)
        seen.append(res)
        return [r["output_sha1"] for r in res["prompts"]]

    a, b, c = run(7), run(7), run(8)
    assert a == b and a != c
    assert a[:2] == a[2:]                      # chain and AR sampled prompt i with the same seed
    res = seen[0]
    assert (res["temperature"], res["top_p"], res["seed"]) == (1.0, 0.95, 7)
    assert res["identical_to_ar"] == {} and res["speedup_vs_ar"]["he"]["chain"] > 0
    greedy = benchmark(make_engine, ["he"], n_prompts=1, max_tokens=8, output=io.StringIO(), warmup=0)
    assert "temperature" not in greedy and greedy["identical_to_ar"]["he"]["chain"]["prompts"] == 1
    with pytest.raises(ConfigError, match="top_p"):
        benchmark(make_engine, ["he"], n_prompts=1, max_tokens=8, output=io.StringIO(), temperature=0.5, top_p=0)


def test_summary_pools_tokens_time_and_steps():
    recs = [
        {"completion_tokens": 10, "decode_s": 1.0, "prompt_tokens": 100, "prefill_s": 0.1, "tokens_per_s": 10.0,
         "accept_hist": {1: 2, 4: 2}},
        {"completion_tokens": 30, "decode_s": 1.0, "prompt_tokens": 300, "prefill_s": 0.1, "tokens_per_s": 30.0,
         "accept_hist": {2: 4}},
    ]
    s = summarize(recs)
    assert s["tokens_per_s"] == 20.0                          # 40 tokens / 2 s, not the mean of rates
    assert s["mean_prompt_tokens_per_s"] == 20.0
    assert s["acceptance_length"] == pytest.approx((2 + 8 + 8) / 8)
    assert s["prefill_tokens_per_s"] == 2000.0
    recs_ar = [dict(r, mode="ar", suite="he", id=f"p{i}", output_sha1=str(i)) for i, r in enumerate(recs)]
    recs_sp = [dict(r, mode="tree", suite="he", id=f"p{i}", output_sha1="x" if i else "0", decode_s=0.5)
               for i, r in enumerate(recs)]
    res = build_results(recs_sp + recs_ar, ["he"], {})
    assert res["speedup_vs_ar"]["he"]["tree"] == 2.0
    assert res["identical_to_ar"]["he"]["tree"] == {"identical": 1, "prompts": 2}


def test_cli_adapter_replaces_spec_per_mode(engine, tmp_path):
    parser = argparse.ArgumentParser()
    parser.add_argument("--spec", default=None)
    parser.add_argument("--max-tokens", type=int, default=99)          # a shared flag is not added twice
    add_bench_args(parser)
    args = parser.parse_args(["--spec", "tree", "--suite", "gsm", "--n-prompts", "1", "--max-tokens", "4",
                              "--out", str(tmp_path), "--warmup", "0"])
    specs = []

    def make_engine(a):
        specs.append(a.spec)
        return SpecLike(engine) if a.spec != "ar" else engine

    assert run_bench(args, make_engine, output=io.StringIO()) == 0
    assert specs == ["tree", "ar"]
    assert json.loads((tmp_path / "results.json").read_text())["prompts"][0]["completion_tokens"] <= 4
    with pytest.raises(ConfigError, match="unknown --suite"):
        run_bench(parser.parse_args(["--suite", "xx"]), make_engine, output=io.StringIO())
    with pytest.raises(ConfigError, match="--n-prompts"):
        run_bench(parser.parse_args(["--n-prompts", "0"]), make_engine, output=io.StringIO())
