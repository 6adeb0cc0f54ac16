"""`dflash24 train-draft` on CPU: the batched training forward equals `draft()`, a few steps reduce the
loss, checkpoints resume exactly, and the written drafter loads in the Engine and generates."""
from __future__ import annotations

import json
import logging
import math

import pytest
import torch

from dflash24.config import EngineConfig, SamplingParams
from dflash24.engine import Engine
from dflash24.gguf.reader import GGUFFile
from dflash24.models import load_target
from dflash24.models.drafter import DFlashDrafter
from dflash24.models.layers import Step
from dflash24.train.data import (BenchmarkGuard, GenSettings, Sequence, TrainDataError, answer_sequences,
                                 first_answer, generate_sequences, iter_json_array, select_prompts)
from dflash24.train.objective import DraftParams, block_loss, position_weights, train_forward
from dflash24.train.trainer import TrainConfig, TrainError, Trainer, drafter_config

from conftest import write_tiny_qwen2_gguf


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return write_tiny_qwen2_gguf(tmp_path_factory.mktemp("t") / "tiny.gguf", n_layers=3, seed=3)


def synthetic_seqs(n=4, length=40, prompt=8, vocab=260, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [Sequence(torch.randint(0, vocab, (length,), generator=g).tolist(), prompt) for _ in range(n)]


def tc_for(target, out, **kw):
    base = dict(model=str(target), out=str(out), layers=1, block=8, lr=3e-3, anchors=16, max_len=64,
                device="cpu", progress=False, save_every=10_000, warmup=0.0, epochs=1)
    base.update(kw)
    return TrainConfig(**base)


@pytest.mark.parametrize("causal", [False, True])
def test_train_forward_equals_draft(target, causal):
    gf = GGUFFile(target)
    model = load_target(gf, "cpu", torch.float32, 256)
    cfg = drafter_config(TrainConfig(model=str(target), out="-", layers=2, block=8), model.cfg)
    if causal:
        from dataclasses import replace
        cfg = replace(cfg, causal=(True, False))
    params = DraftParams(cfg, seed=5)
    sd = params.export(torch.float32)
    drafter = DFlashDrafter.from_state_dict(cfg, sd, max_positions=256)
    ids = torch.tensor(synthetic_seqs(1, 30)[0].ids)
    with torch.no_grad():
        _, feats = model(ids, Step.sequential(0, 30), model.new_cache(32, torch.float32, "cpu"),
                         cfg.target_layer_ids)
        from dflash24.train.trainer import lm_head_weight
        W = lm_head_weight(gf, model.cfg, "cpu", torch.float32)
        anchors = torch.tensor([3, 11, 17, 25])
        batched = train_forward(params, feats, ids, anchors, model.token_embd, W)
        for n, a in enumerate(anchors.tolist()):
            cache = drafter.new_cache(64, torch.float32, "cpu")
            drafter.add_context(feats[:a], torch.arange(a), cache)
            ref = drafter.draft(ids[a:a + 1], a, cache, model.token_embd, model.output)
            torch.testing.assert_close(batched[n], ref.float(), rtol=1e-4, atol=1e-4)


def test_batched_forward_equals_one_sequence_at_a_time(target):
    """Sequences of different lengths and anchor counts in one drafter forward: each sequence's rows equal its
    own forward (the padded context and padding anchors are invisible to it), with a sliding-window layer too."""
    from dataclasses import replace
    from dflash24.train.objective import train_forward_batch
    from dflash24.train.trainer import lm_head_weight
    gf = GGUFFile(target)
    model = load_target(gf, "cpu", torch.float32, 256)
    cfg = drafter_config(TrainConfig(model=str(target), out="-", layers=2, block=8), model.cfg)
    cfg = replace(cfg, causal=(True, False), layer_types=("sliding_attention", "full_attention"), sliding_window=6)
    params = DraftParams(cfg, seed=5)
    W = lm_head_weight(gf, model.cfg, "cpu", torch.float32)
    seqs = [torch.tensor(s.ids) for s in synthetic_seqs(3, 30)]
    seqs[1] = seqs[1][:19]
    anchors = [torch.tensor([3, 11, 17, 25]), torch.tensor([2, 9]), torch.tensor([0, 5, 6, 13, 28])]
    with torch.no_grad():
        feats = [model(ids, Step.sequential(0, len(ids)), model.new_cache(32, torch.float32, "cpu"),
                       cfg.target_layer_ids)[1] for ids in seqs]
        batched = train_forward_batch(params, feats, seqs, anchors, model.token_embd, W,
                                      [int(a.max()) for a in anchors])
        assert batched.shape == (3, 5, 7, model.cfg.vocab_size)
        for s in range(3):
            alone = train_forward(params, feats[s], seqs[s], anchors[s], model.token_embd, W)
            torch.testing.assert_close(batched[s, :len(anchors[s])], alone, rtol=1e-5, atol=1e-5)


def test_micro_batches_train_like_single_sequences(target, tmp_path):
    """A step over 4 sequences of different lengths in one micro-batch and in micro-batches of 1 (the same
    weights and anchors): the same loss and the same gradients, to rounding."""
    seqs = synthetic_seqs(n=4, length=40)
    seqs[1] = Sequence(seqs[1].ids[:25], seqs[1].prompt_len)
    a = Trainer(tc_for(target, tmp_path / "a", steps=2, batch_size=4, micro_batch=4), seqs)
    b = Trainer(tc_for(target, tmp_path / "b", steps=2, batch_size=4, micro_batch=3), seqs)
    ra, rb = a.train_step(), b.train_step()
    assert ra["loss"] == pytest.approx(rb["loss"], rel=1e-5)
    for (n, pa), pb in zip(a.params.named_parameters(), b.params.parameters()):
        torch.testing.assert_close(pa.grad, pb.grad, rtol=1e-4, atol=1e-7, msg=n)


def test_block_loss_weights_and_accuracy():
    w = position_weights(4, 7.0)
    assert torch.allclose(w, torch.exp(-torch.arange(3) / 7.0))
    logits = torch.full((2, 3, 5), -10.0)
    labels = torch.tensor([[1, 2, 3], [1, 0, -100]])
    logits[0, 0, 1] = logits[0, 1, 2] = logits[0, 2, 4] = 10.0            # row 0: right, right, wrong
    logits[1, 0, 1] = logits[1, 1, 3] = 10.0                               # row 1: right, wrong, (no label)
    loss, st = block_loss(logits, labels, w)
    assert st["acc_pos"].tolist() == [1.0, 0.5, 0.0] and st["n_pos"].tolist() == [2, 2, 1]
    assert float(st["accepted"]) == 1.5                                    # prefixes 2 and 1
    assert loss > 0


def test_training_reduces_loss_and_resumes(target, tmp_path):
    seqs = synthetic_seqs()
    tr = Trainer(tc_for(target, tmp_path / "a", steps=30, lr=1e-2), seqs)
    fixed = [(s, tr.anchors(s)) for s in tr.seqs]

    def eval_loss():
        with torch.no_grad():
            return sum(float(tr.sequence_loss(s, a)[0]) for s, a in fixed) / len(fixed)

    before = eval_loss()
    recs = tr.fit()
    after = eval_loss()
    # the tiny target's frozen LM head is N(0, 0.02): logits are small, so CE moves slowly from ln(vocab)
    assert after < before - 0.1, (before, after)
    first = sum(r["loss"] for r in recs[:4]) / 4
    last = sum(r["loss"] for r in recs[-4:]) / 4
    assert last < first
    log_lines = (tmp_path / "a" / "train_log.jsonl").read_text().splitlines()
    assert len(log_lines) == 30 and len(json.loads(log_lines[-1])["acc_pos"]) == 7

    # resume: 3 + 3 steps == 6 steps straight
    straight = Trainer(tc_for(target, tmp_path / "s", steps=6), seqs)
    straight.fit()
    half = Trainer(tc_for(target, tmp_path / "h", steps=6), seqs)
    for _ in range(3):
        half.train_step()
    half.save_checkpoint()
    resumed = Trainer(tc_for(target, tmp_path / "h", steps=6), seqs)
    resumed.load_checkpoint()
    assert resumed.step == 3
    resumed.fit()
    for k, v in straight.params.state_dict().items():
        torch.testing.assert_close(resumed.params.state_dict()[k], v, rtol=0, atol=0)
    assert resumed.sched.get_last_lr() == straight.sched.get_last_lr()


def test_generate_export_and_engine_loads(target, tmp_path, caplog):
    engine = Engine(EngineConfig(model=str(target), ctx=128, device="cpu"))
    prompts = select_prompts(["the cat sat", "write a sort", "hello there"], None)
    settings = GenSettings(max_new_tokens=12, max_len=64)
    seqs = generate_sequences(engine, prompts, settings, tmp_path / "data", progress=False)
    assert len(seqs) == 3 and all(len(s.ids) > s.prompt_len for s in seqs)
    # the response is the target's own greedy continuation
    s = seqs[0]
    got = [t for ev in engine.generate(s.ids[:s.prompt_len], SamplingParams(max_tokens=12)) for t in ev.token_ids]
    assert s.ids[s.prompt_len:s.prompt_len + len(got)] == got
    # cached: a re-run does not call the engine
    again = generate_sequences(_NoEngine(engine), prompts, settings, tmp_path / "data",
                               target_path=str(target), progress=False)
    assert [x.ids for x in again] == [x.ids for x in seqs]
    with pytest.raises(TrainDataError, match="settings"):
        generate_sequences(engine, prompts, GenSettings(max_new_tokens=5, max_len=64), tmp_path / "data",
                           progress=False)
    # a run killed while writing: the cut last line is dropped and that prompt answered again, nothing twice
    f = tmp_path / "data" / "sequences.jsonl"
    raw = f.read_bytes()
    f.write_bytes(raw[:raw.rstrip(b"\n").rfind(b"\n") + 1] + b'{"prompt_len": 5, "ids": [1, 2')
    with caplog.at_level(logging.WARNING, logger="dflash24.train"):
        resumed = generate_sequences(engine, prompts, settings, tmp_path / "data", progress=False)
    assert "unfinished last line" in caplog.text
    assert [x.ids for x in resumed] == [x.ids for x in seqs] and f.read_bytes() == raw
    # killed after the first answer: the manifest is already there, so the next run continues from answer 2
    class Interrupted(Exception):
        pass

    class DiesAfterOne:
        def __init__(self):
            self.calls, self.tokenizer, self.model_path = 0, engine.tokenizer, engine.model_path
            self.model = engine.model

        def encode_chat(self, msgs):
            return engine.encode_chat(msgs)

        def generate(self, ids, params):
            self.calls += 1
            if self.calls > 1:
                raise Interrupted
            return engine.generate(ids, params)
    with pytest.raises(Interrupted):
        generate_sequences(DiesAfterOne(), prompts, settings, tmp_path / "killed", target_path=str(target),
                           progress=False)
    assert (tmp_path / "killed" / "manifest.json").is_file()
    assert len((tmp_path / "killed" / "sequences.jsonl").read_text().splitlines()) == 1
    rest = generate_sequences(engine, prompts, settings, tmp_path / "killed", progress=False)
    assert [x.ids for x in rest] == [x.ids for x in seqs]
    # sequences whose target nobody recorded are refused, not appended to
    (tmp_path / "data" / "manifest.json").unlink()
    with pytest.raises(TrainDataError, match="without manifest.json"):
        generate_sequences(engine, prompts, settings, tmp_path / "data", progress=False)

    out = tmp_path / "drafter"
    tr = Trainer(tc_for(target, out, steps=3), seqs + synthetic_seqs(2))      # engine-generated + synthetic
    tr.fit()
    tr.export()
    c = json.loads((out / "config.json").read_text())
    assert len(c["dflash_config"]["target_sha256"]) == 64 and c["dflash_config"]["target_model"] == "tiny.gguf"
    eng = Engine(EngineConfig(model=str(target), draft=str(out), spec="chain", ctx=128, device="cpu"))
    ev = list(eng.generate(seqs[0].ids[:seqs[0].prompt_len], SamplingParams(max_tokens=10, ignore_eos=True)))
    assert ev[-1].stats.completion_tokens == 10 and ev[-1].stats.mode == "chain"

    # a drafter recorded for another target file: the engine warns
    c["dflash_config"]["target_sha256"] = "0" * 64
    (out / "config.json").write_text(json.dumps(c))
    from dflash24.models.drafter import load_drafter
    with caplog.at_level(logging.WARNING):
        load_drafter(out, "cpu", torch.float32, 128, eng.model, target_path=str(target))
    assert any("sha256" in r.getMessage() for r in caplog.records)
    caplog.clear()
    from dflash24.train.fingerprint import target_sha256
    c["dflash_config"]["target_sha256"] = target_sha256(target)
    (out / "config.json").write_text(json.dumps(c))
    with caplog.at_level(logging.WARNING):
        load_drafter(out, "cpu", torch.float32, 128, eng.model, target_path=str(target))
    assert not any("sha256" in r.getMessage() for r in caplog.records)


def test_cli_train_draft_parses():
    from dflash24.cli import build_parser
    a = build_parser().parse_args(["train-draft", "--model", "t.gguf", "--out", "d", "--layers", "2", "--steps", "5",
                                   "--resume", "--n-prompts", "100", "--data-dir", "x", "--responses", "sharegpt",
                                   "--sharegpt", "sub.json"])
    assert a.func.__name__ == "cmd_train_draft" and a.layers == 2 and a.steps == 5 and a.resume
    assert a.responses == "sharegpt" and a.sharegpt == "sub.json" and build_parser().parse_args(["train-draft", "--out", "d"]).responses == "target"
    assert a.block == 16 and a.lr == 6e-4 and a.anchors == 512 and a.max_len == 2048
    assert a.gen_batch is None and a.init is None and a.max_minutes is None
    b = build_parser().parse_args(["train-draft", "--out", "d", "--gen-batch", "32", "--init", "prev",
                                   "--max-minutes", "7.5", "--feature-cache", "fc"])
    assert b.gen_batch == 32 and b.init == "prev" and b.max_minutes == 7.5 and b.feature_cache == "fc"


@pytest.mark.parametrize("flags,message", [
    (["--micro-batch", "0"], "--micro-batch must be at least 1, got 0"),
    (["--block", "1"], "--block must be at least 2, got 1"),
    (["--max-len", "10"], "--max-len must be at least 18, got 10"),
    (["--lr", "nan"], "--lr must be a finite positive number, got nan"),
    (["--max-minutes", "-1"], "--max-minutes must be a finite number >= 0, got -1.0"),
    (["--kl", "-0.5"], "--kl must be a finite number >= 0, got -0.5"),
    (["--gen-batch", "0"], "--gen-batch must be at least 1, got 0"),
    (["--temperature", "inf"], "--temperature must be a finite number >= 0, got inf"),
    (["--init", "nowhere"], "--init nowhere: needs config.json and model.safetensors"),
])
def test_cli_train_draft_refuses_bad_flags_before_any_data(target, tmp_path, capsys, monkeypatch, flags, message):
    """A bad flag stops train-draft at once with one line, before prompts are read or a response generated."""
    from dflash24 import cli
    from dflash24.train import data
    monkeypatch.setattr(data, "sharegpt_prompts", lambda *a, **k: pytest.fail("data was read"))
    monkeypatch.setattr(data, "sharegpt_pairs", lambda *a, **k: pytest.fail("data was read"))
    assert cli.main(["train-draft", "--model", str(target), "--out", str(tmp_path / "d")] + flags) == 2
    err = capsys.readouterr().err
    assert err.startswith("dflash24: error: ") and message in err and "Traceback" not in err


class _NoEngine:
    """Engine stand-in that fails if generation is attempted (the cache must be used)."""

    def __init__(self, engine):
        self.tokenizer, self.model_path = engine.tokenizer, engine.model_path

    def encode_chat(self, *a, **k):
        raise AssertionError("generation ran despite the cache")

    generate = encode_chat


def test_sharegpt_parsing_and_benchmark_guard():
    text = '[\n {"id": "a", "conversations": [{"from": "human", "value": "Hi there, how are you"}]},\n' \
           ' {"id": "b", "conversations": [{"from": "gpt", "value": "x"}, {"from": "human", "value": "q2"}]},\n' \
           ' {"id": "c", "conversations": [{"from": "human", "value": "cut o'
    objs = list(iter_json_array(text))
    assert [o["id"] for o in objs] == ["a", "b"]
    guard = BenchmarkGuard()
    from dflash24.bench.datasets import load_suite
    bench = load_suite("gsm")[0].text
    question = bench.removeprefix("Question: ").split("\nAnswer:")[0]
    assert guard.overlaps(question) and guard.overlaps("Please solve: " + question)
    kept = select_prompts(["Hi there, how are you", "hi  there, HOW are you", question, "ok"], None, min_chars=4)
    assert kept == ["Hi there, how are you"]


def test_dataset_answers_with_target_labels(target, tmp_path, monkeypatch):
    """--responses sharegpt: ShareGPT's own answer after the chat-templated prompt, and labels that are the
    target's greedy next token at each position (not the dataset's); training on them reduces the loss."""
    conv = {"conversations": [{"from": "system", "value": "s"}, {"from": "human", "value": "Sort a list?"},
                              {"from": "gpt", "value": "Use sorted(xs) for a new list."}]}
    assert first_answer(conv) == ("Sort a list?", "Use sorted(xs) for a new list.")
    assert first_answer({"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": " "}]}) is None
    eng = Engine(EngineConfig(model=str(target), ctx=128, device="cpu"))
    pairs = [("Sort a list?", "Use sorted(xs) for a new list."), ("the cat sat", "on the mat, and then it slept")]
    seqs = answer_sequences(eng.tokenizer, eng.chat_template, pairs, max_len=64)
    s = seqs[0]
    assert s.ids[:s.prompt_len] == eng.encode_chat([{"role": "user", "content": "Sort a list?"}])
    assert eng.tokenizer.decode(s.ids[s.prompt_len:-1]) == "Use sorted(xs) for a new list."
    assert s.ids[-1] == eng.tokenizer.eos_token_id
    assert answer_sequences(eng.tokenizer, eng.chat_template, pairs, max_len=8) == []      # prompts too long

    tr = Trainer(tc_for(target, tmp_path / "t", steps=20, lr=1e-2, labels="target"), seqs * 2)
    seen = []
    import dflash24.train.trainer as trainer_mod
    real = trainer_mod.block_loss
    monkeypatch.setattr(trainer_mod, "block_loss",
                        lambda logits, labels, *a: seen.append(labels) or real(logits, labels, *a))
    seq, anchors = tr.seqs[0], tr.anchors(tr.seqs[0])
    with torch.no_grad():
        before = float(tr.sequence_loss(seq, anchors)[0])
        ids = torch.tensor(seq.ids)
        _, tlogits = tr.features(ids, True)
    pos = anchors[:, None] + torch.arange(1, tr.cfg.block_size)[None, :]
    want = torch.where(pos < len(seq.ids), tlogits.argmax(-1)[(pos - 1).clamp(max=len(seq.ids) - 1)], -100)
    assert torch.equal(seen[0], want) and not torch.equal(seen[0][pos < len(seq.ids)], ids[pos[pos < len(seq.ids)]])
    tr.fit()
    with torch.no_grad():
        assert float(tr.sequence_loss(seq, anchors)[0]) < before - 0.1
    with pytest.raises(ValueError, match="labels must be tokens or target"):
        Trainer(tc_for(target, tmp_path / "u", labels="dataset"), seqs)


def test_sharegpt_file_of_ones_own(tmp_path):
    """--sharegpt FILE: a ShareGPT-format array read instead of the package's file (benchmark guard still on)."""
    from dflash24.bench.datasets import load_suite
    from dflash24.train.data import sharegpt_pairs, sharegpt_prompts
    bench_q = load_suite("gsm")[0].text.removeprefix("Question: ").split("\nAnswer:")[0]
    convs = [{"conversations": [{"from": "human", "value": "How do I reverse a list in Python?"},
                                {"from": "gpt", "value": "Use xs[::-1] or xs.reverse()."}]},
             {"conversations": [{"from": "human", "value": bench_q}, {"from": "gpt", "value": "42"}]},
             {"conversations": [{"from": "human", "value": "Name a prime."}]}]
    f = tmp_path / "subset.json"
    f.write_text(json.dumps(convs))
    assert sharegpt_pairs(None, path=f) == [("How do I reverse a list in Python?", "Use xs[::-1] or xs.reverse().")]
    assert sharegpt_prompts(None, path=f) == ["How do I reverse a list in Python?", "Name a prime."]
    with pytest.raises(TrainDataError, match="no such ShareGPT file"):
        sharegpt_pairs(None, path=tmp_path / "missing.json")
    odd = [{"conversations": 5}, {"conversations": "hi"}, {"conversations": None}, {"x": 1}, convs[0]]
    f.write_text(json.dumps(odd))                        # records of other shapes are skipped, not a TypeError
    assert sharegpt_pairs(None, path=f) == [("How do I reverse a list in Python?", "Use xs[::-1] or xs.reverse().")]
    for content, match in [(b"\xff\xfe[", "not a readable UTF-8 ShareGPT file"), (b"{}", "not a JSON array")]:
        f.write_bytes(content)
        with pytest.raises(TrainDataError, match=match):
            sharegpt_prompts(None, path=f)



def test_time_limit_and_periodic_export(target, tmp_path, caplog):
    """--max-minutes stops early with a checkpoint; every save also exports a drafter the Engine can load."""
    seqs = synthetic_seqs()
    tr = Trainer(tc_for(target, tmp_path / "d", steps=50, save_every=2, max_minutes=0.0), seqs)
    with caplog.at_level(logging.WARNING, logger="dflash24.train"):
        tr.fit()
    assert tr.step == 1 and "time limit reached at step 1" in caplog.text
    assert (tmp_path / "d" / "checkpoint.pt").is_file()
    assert not (tmp_path / "d" / "model.safetensors").exists()     # step 1 is before the first save
    tr2 = Trainer(tc_for(target, tmp_path / "e", steps=3, save_every=2), seqs)
    tr2.fit()
    cfg = json.loads((tmp_path / "e" / "config.json").read_text())
    assert cfg["dflash_config"]["training"]["steps"] == 2          # exported at step 2; the final save is step 3
    d = DFlashDrafter.from_pretrained(tmp_path / "e")
    assert d.cfg.n_layers == 1 and d.cfg.block_size == 8


def test_clock_schedule(target, tmp_path, monkeypatch):
    """--minutes: the learning rate warms up and decays with the training time (earlier runs' time included
    after --resume), and training stops when the time is up, whatever the step count."""
    import dflash24.train.trainer as trainer_mod
    now = [1000.0]
    monkeypatch.setattr(trainer_mod.time, "perf_counter", lambda: now[0])
    tr = Trainer(tc_for(target, tmp_path / "d", minutes=1.0, lr=1e-3, warmup=0.1), synthetic_seqs())
    tr._t0 = now[0]
    assert tr.lr_factor(0) == pytest.approx(1 / 1000)           # 0 s of a 6 s warmup (10 % of 60 s)
    now[0] += 6.0
    assert tr.lr_factor(0) == pytest.approx(1.0)
    now[0] += 27.0                                              # half of the cosine (6 + 27 of 60 s)
    assert tr.lr_factor(123) == pytest.approx(0.5)
    assert not tr.time_up()
    now[0] += 27.0
    assert tr.lr_factor(0) == pytest.approx(0.0, abs=1e-6) and tr.time_up()
    tr.trained_s, tr._t0 = 30.0, now[0]                         # resumed after 30 s of training: mid-schedule
    assert tr.lr_factor(0) == pytest.approx(0.5 * (1 + math.cos(math.pi * 24 / 54)))

    tr2 = Trainer(tc_for(target, tmp_path / "e", minutes=0.5, save_every=1000), synthetic_seqs())

    def four_second_step():
        now[0] += 4.0
        tr2.step += 1
        return {"step": tr2.step, "loss": 1.0, "al_est": 1.0}
    monkeypatch.setattr(tr2, "train_step", four_second_step)
    tr2.fit()
    assert tr2.step == 8                                        # 30 s at 4 s per step: stops after the 8th
    assert torch.load(tmp_path / "e" / "checkpoint.pt", weights_only=False)["trained_s"] == pytest.approx(32.0)
    with pytest.raises(TrainError, match="--minutes must be a finite positive number, got 0.0"):
        Trainer(tc_for(target, tmp_path / "f", minutes=0.0), synthetic_seqs())


def test_init_from_an_exported_drafter(target, tmp_path):
    """--init continues from a written drafter's weights; a drafter of another layout is refused by name."""
    seqs = synthetic_seqs()
    first = Trainer(tc_for(target, tmp_path / "a", steps=3), seqs)
    first.fit()
    first.export()
    again = Trainer(tc_for(target, tmp_path / "b", steps=3, init=str(tmp_path / "a")), seqs)
    for k, v in first.params.export().items():
        torch.testing.assert_close(again.params[k].to(v.dtype), v, rtol=0, atol=0)
    with pytest.raises(TrainError, match="n_layers 1 != 2"):
        Trainer(tc_for(target, tmp_path / "c", steps=3, layers=2, init=str(tmp_path / "a")), seqs)
    with pytest.raises(TrainError, match="needs config.json and model.safetensors"):
        Trainer(tc_for(target, tmp_path / "c", steps=3, init=str(tmp_path / "nothing")), seqs)


def test_batched_generation_equals_one_at_a_time(target, tmp_path):
    """Prompts decoded together in one packed cache give each prompt's own greedy answer (and the same
    records: too-long prompts skipped, groups of 3 then 2)."""
    from dflash24.train.batchgen import supports
    engine = Engine(EngineConfig(model=str(target), ctx=128, device="cpu"))
    assert supports(engine.model)
    prompts = ["the cat sat", "write a sort function in python please", "hi", "x " * 40, "hello there"]
    settings = GenSettings(max_new_tokens=10, max_len=48)
    single = generate_sequences(engine, prompts, settings, tmp_path / "one", progress=False)
    batched = generate_sequences(engine, prompts, settings, tmp_path / "three", progress=False, batch=3)
    assert [s.finish for s in single][3] == "skipped"
    assert [(s.ids, s.prompt_len, s.finish) for s in batched] == [(s.ids, s.prompt_len, s.finish) for s in single]
    assert (tmp_path / "three" / "sequences.jsonl").read_text() == (tmp_path / "one" / "sequences.jsonl").read_text()


def test_generate_batch_stops_and_refuses_recurrent_targets(target, tmp_path):
    from dflash24.synth import write_preset
    from dflash24.train.batchgen import generate_batch
    model = load_target(GGUFFile(str(target)), "cpu", torch.float32, max_positions=256)
    prompts = [[5, 6, 7, 8], [9, 10], [11, 12, 13]]
    free = generate_batch(model, prompts, [8, 8, 8], set(), region=16, dtype=torch.float32, device="cpu")
    assert all(o.finish == "length" and len(o.tokens) == 8 for o in free)
    end = free[0].tokens[3]                                   # make prompt 0's 4th token an end token
    cut = generate_batch(model, prompts, [8, 8, 8], {end}, region=16, dtype=torch.float32, device="cpu")
    first = free[0].tokens.index(end)
    assert cut[0].tokens == free[0].tokens[:first] and cut[0].finish == "stop"
    for o, f in zip(cut[1:], free[1:]):                       # the others run on, unaffected, up to `end`
        n = f.tokens.index(end) if end in f.tokens else len(f.tokens)
        assert o.tokens == f.tokens[:n]
    with pytest.raises(ValueError, match="do not fit a 16-row region"):
        generate_batch(model, prompts, [13, 8, 8], set(), region=16, dtype=torch.float32, device="cpu")
    q35 = write_preset("qwen35-tiny", str(tmp_path / "q35.gguf"), seed=1)
    m35 = load_target(GGUFFile(q35), "cpu", torch.float32, max_positions=64)
    with pytest.raises(ValueError, match="needs a dense target"):
        generate_batch(m35, prompts, [4, 4, 4], set(), region=16, dtype=torch.float32, device="cpu")


@pytest.mark.parametrize("labels", ["tokens", "target"])
def test_feature_cache_gives_the_same_training(target, tmp_path, labels, monkeypatch):
    """--feature-cache: the first run computes and stores the target's features (and greedy tokens), a second
    run reads them without running the target; both train to the same parameters as no cache, bit for bit.
    A cache of other sequences, or used with --kl, is refused."""
    from dflash24.train.features import FeatureCacheError
    seqs = synthetic_seqs(n=5)
    kw = dict(steps=6, batch_size=2, labels=labels)
    plain = Trainer(tc_for(target, tmp_path / "p", **kw), seqs)
    plain.fit()
    first = Trainer(tc_for(target, tmp_path / "a", feature_cache=str(tmp_path / "fc"), **kw), seqs)
    first.fit()
    assert first.fcache.done.all()                       # 12 sequence visits cover all 5 sequences
    second = Trainer(tc_for(target, tmp_path / "b", feature_cache=str(tmp_path / "fc"), **kw), seqs)
    monkeypatch.setattr(second, "features", lambda *a: (_ for _ in ()).throw(AssertionError("target ran")))
    second.fit()
    for k, v in plain.params.state_dict().items():
        torch.testing.assert_close(first.params.state_dict()[k], v, rtol=0, atol=0)
        torch.testing.assert_close(second.params.state_dict()[k], v, rtol=0, atol=0)
    with pytest.raises(FeatureCacheError, match="another run"):
        Trainer(tc_for(target, tmp_path / "c", feature_cache=str(tmp_path / "fc"), **kw), synthetic_seqs(n=5, seed=9))
    with pytest.raises(TrainError, match="--kl"):
        Trainer(tc_for(target, tmp_path / "d", feature_cache=str(tmp_path / "fk"), kl_weight=0.5, **kw), seqs)


def test_feature_cache_refuses_a_disk_too_small(target, tmp_path, monkeypatch):
    import shutil
    from collections import namedtuple
    from dflash24.train.features import FeatureCacheError
    Usage = namedtuple("Usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda p: Usage(10**9, 10**9 - 1000, 1000))
    with pytest.raises(FeatureCacheError, match=r"needs 0\.\d+ GiB more disk, 0\.00 GiB are free"):
        Trainer(tc_for(target, tmp_path / "a", feature_cache=str(tmp_path / "fc"), steps=2), synthetic_seqs(n=5))


@pytest.mark.parametrize("manifest", ["{", "[1]", b"\xff"])
def test_a_damaged_feature_cache_manifest_is_refused(target, tmp_path, manifest):
    """A feature-cache manifest that is not readable JSON (a crash mid-write, someone's edit) is a TrainDataError
    naming the file, which train-draft reports in one line (FeatureCacheError is one)."""
    from dflash24.train.features import FeatureCacheError
    (tmp_path / "fc").mkdir()
    (tmp_path / "fc" / "manifest.json").write_bytes(manifest if isinstance(manifest, bytes) else manifest.encode())
    with pytest.raises(FeatureCacheError, match=r"manifest\.json: not a"):
        Trainer(tc_for(target, tmp_path / "a", feature_cache=str(tmp_path / "fc"), steps=2), synthetic_seqs(n=2))
    assert issubclass(FeatureCacheError, TrainDataError)


@pytest.mark.parametrize("manifest,line,match", [
    ("{", None, r"manifest\.json: not a readable data manifest"),
    ("[]", None, r"manifest\.json: not a data manifest \(a JSON list\)"),
    ("{}", "{not json", r"sequences\.jsonl:2: not a JSON line"),
    ("{}", '{"ids": [1, "2"], "prompt_len": 1}', r"sequences\.jsonl:2: expected"),
    ("{}", '{"ids": [1, 2], "prompt_len": 3}', r"sequences\.jsonl:2: expected"),
    ("{}", '{"ids": [1, -2], "prompt_len": 1}', r"sequences\.jsonl:2: expected"),
    ("{}", '[1, 2]', r"sequences\.jsonl:2: expected"),
])
def test_a_damaged_data_dir_is_refused(tmp_path, manifest, line, match):
    """--data-dir's files are read back line by line: a damaged one is a TrainDataError naming the file and line,
    not a JSONDecodeError or KeyError (or token ids that would index past the embedding later)."""
    from dflash24.train.data import load_cache
    (tmp_path / "manifest.json").write_text(manifest)
    good = '{"ids": [5, 6, 7], "prompt_len": 1, "finish": "stop"}'
    (tmp_path / "sequences.jsonl").write_text(good + "\n" + (line + "\n" if line else ""))
    with pytest.raises(TrainDataError, match=match):
        load_cache(tmp_path)
    (tmp_path / "manifest.json").write_text("{}")
    (tmp_path / "sequences.jsonl").write_text(good + "\n")
    assert [(s.ids, s.prompt_len) for s in load_cache(tmp_path)[1]] == [([5, 6, 7], 1)]


def test_batched_generation_halves_the_batch_when_memory_runs_out(target, tmp_path, monkeypatch, caplog):
    from dflash24.train import batchgen
    engine = Engine(EngineConfig(model=str(target), ctx=128, device="cpu"))
    prompts = ["the cat sat", "write a sort", "hi", "hello there", "one more"]
    settings = GenSettings(max_new_tokens=6, max_len=48)
    single = generate_sequences(engine, prompts, settings, None, progress=False)
    real, sizes = batchgen.generate_batch, []

    def small_gpu(model, group, *a, **kw):
        sizes.append(len(group))
        if len(group) > 2:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (simulated)")
        return real(model, group, *a, **kw)

    monkeypatch.setattr(batchgen, "generate_batch", small_gpu)
    with caplog.at_level(logging.WARNING, logger="dflash24.train"):
        got = generate_sequences(engine, prompts, settings, None, progress=False, batch=5)
    assert sizes == [5, 2, 3, 1, 2] and "5 prompts at once ran out of GPU memory" in caplog.text
    assert [s.ids for s in got] == [s.ids for s in single]


class _RunsCode:
    def __reduce__(self):                      # unpickling this would call print(...)
        return (print, ("the checkpoint ran code",))


@pytest.mark.parametrize("content", ["garbage", "code", "foreign"])
def test_a_bad_checkpoint_is_refused(target, tmp_path, capsys, content):
    """--resume reads tensors and plain data only: a pickle that would run code, a damaged file and someone
    else's checkpoint are each a TrainError naming the file, and nothing in them runs."""
    seqs = synthetic_seqs()
    path = tmp_path / "checkpoint.pt"
    if content == "garbage":
        path.write_bytes(b"PK\x03\x04 not a checkpoint")
    else:
        torch.save({"payload": _RunsCode()} if content == "code" else {"weights": torch.zeros(2)}, path)
    trainer = Trainer(tc_for(target, tmp_path, steps=1), seqs)
    with pytest.raises(TrainError, match=r"checkpoint\.pt: not a checkpoint"):
        trainer.load_checkpoint(path)
    assert "the checkpoint ran code" not in capsys.readouterr().out
