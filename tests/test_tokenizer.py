"""The GGUF tokenizer against HF transformers' tokenizer built from the same file (Qwen2.5-Coder 0.5B)."""
import pytest

from dflash24.gguf.reader import GGUFError, GGUFFile
from dflash24.gguf.tokenizer import IncrementalDetokenizer, Tokenizer

TEXTS = [
    "",
    " ",
    "Hello, world!",
    "hello world",
    "  leading spaces",
    "trailing spaces   ",
    "\n",
    "\n\n\n",
    "a\r\nb\rc\n",
    "\t\ttabs\tand  mixed \t whitespace",
    "                                 many spaces",
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "for (int i = 0; i < 10; ++i) { printf(\"%d\\n\", i); }",
    "import numpy as np\nx = np.arange(12).reshape(3, 4) @ np.eye(4)\n",
    "SELECT name, COUNT(*) FROM users WHERE age >= 18 GROUP BY name;",
    "<div class=\"x\">&amp; &lt;tag&gt;</div>",
    "{\"key\": [1, 2.5, -3e10, null, true], \"nested\": {\"a\": \"b\"}}",
    "12345678901234567890",
    "3.14159 2,718 1e-9 0x1F 0b1010 -42",
    "The year 2024 had 366 days.",
    "I'm you're they've we'll she'd it's",
    "IT'S LOUD'S I'M",
    "Ünïcödé çàfé naïve résumé",
    "Привет, мир! Как дела?",
    "Γειά σου Κόσμε",
    "مرحبا بالعالم",
    "שלום עולם",
    "नमस्ते दुनिया",
    "你好，世界！今天天气很好。",
    "日本語のテキストです。カタカナとひらがな。",
    "한국어 텍스트입니다",
    "混合 mixed 文本 text 123",
    "😀😃😄😁 emoji 🚀🔥",
    "👨‍👩‍👧‍👦 family 🏳️‍🌈 flags 🇯🇵",
    "e\u0301 combining accent, \u00e9 precomposed",
    "zero\u200bwidth\u200djoiner",
    "math: ∀x∈ℝ, x²≥0; ∑ᵢ aᵢ ≈ ∫ f(x) dx",
    "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>system\nYou are helpful.<|im_end|><|im_start|>user\n你好<|im_end|>",
    "text<|endoftext|>more text",
    "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>",
    "<|fim_prefix|>def f():\n<|fim_suffix|>\n    return 1<|fim_middle|>",
    "<|im_start|><|im_end|><|im_start|>",
    "almost special <|im_start and |im_end|> and <im_start>",
    "~!@#$%^&*()_+-=[]{}|;':\",./<>?`",
    "----------========**********",
    "a" * 200,
    "ab " * 50,
    "https://example.com/path?query=1&b=2#frag",
    "user@example.com +1-555-0100",
    "C:\\Users\\name\\file.txt",
    "\u00a0non-breaking\u00a0space\u3000ideographic space",
]


@pytest.fixture(scope="module")
def tok(default_gguf_path):
    return Tokenizer.from_gguf(GGUFFile(default_gguf_path))


def test_metadata(tok):
    assert tok.vocab_size == 151936
    assert tok.token_to_id("<|im_end|>") == 151645
    assert tok.token_to_id("<|im_start|>") == 151644
    assert tok.bos_token_id == 151643 and tok.add_bos is False
    assert tok.eos_token_ids == {151645, 151643}      # <|im_end|> (file's eos) and <|endoftext|>
    assert tok.token_to_id("no such token here") is None


@pytest.mark.parametrize("text", TEXTS)
def test_ids_equal_hf(tok, hf_default_tokenizer, text):
    ours = tok.encode(text)
    assert ours == hf_default_tokenizer.encode(text, add_special_tokens=False)
    assert tok.decode(ours) == text                                       # lossless round trip
    assert tok.decode(ours) == hf_default_tokenizer.decode(ours)
    assert tok.decode(ours, skip_special_tokens=True) == hf_default_tokenizer.decode(ours, skip_special_tokens=True)


def test_special_tokens_recognised(tok):
    ids = tok.encode("<|im_start|>user\nhi<|im_end|>")
    assert ids[0] == 151644 and ids[-1] == 151645
    assert tok.decode(ids, skip_special_tokens=True) == "user\nhi"
    assert 151657 in tok.encode("<tool_call>")            # user-defined token: whole, and not special
    assert tok.decode(tok.encode("x<tool_call>"), skip_special_tokens=True) == "x<tool_call>"


def test_bad_ids(tok):
    with pytest.raises(ValueError, match="outside the vocabulary"):
        tok.decode([tok.vocab_size])
    with pytest.raises(ValueError, match="outside the vocabulary"):
        tok.decode([-1])


def _stream(tok, ids, **kw):
    d = IncrementalDetokenizer(tok, **kw)
    pieces = [d.push(i) for i in ids]
    pieces.append(d.flush())
    return pieces


@pytest.mark.parametrize("text", TEXTS)
def test_detokenizer_stream_equals_decode(tok, text):
    ids = tok.encode(text)
    pieces = _stream(tok, ids)
    assert "".join(pieces) == tok.decode(ids) == text
    assert not any("\ufffd" in p for p in pieces)
    pieces = _stream(tok, ids, skip_special_tokens=True)
    assert "".join(pieces) == tok.decode(ids, skip_special_tokens=True)


def test_detokenizer_holds_back_partial_characters(tok):
    # Byte-level tokens may split one character: each piece must still be whole characters.
    text = "🚀🔥👨‍👩‍👧 中文字符 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 " * 3
    ids = tok.encode(text)
    split = [i for i in ids if not tok.token_bytes(i).decode("utf-8", errors="ignore")
             or len(tok.token_bytes(i).decode("utf-8", errors="replace")) != len(tok.token_bytes(i).decode("utf-8", errors="ignore"))]
    assert split, "test text should contain tokens holding a part of a character"
    d = IncrementalDetokenizer(tok)
    out = []
    for i in ids:
        piece = d.push(i)
        assert "\ufffd" not in piece
        out.append(piece)
    assert d.flush() == ""
    assert "".join(out) == text
    # Byte by byte through single-byte tokens: nothing comes out until the 4-byte character is complete.
    byte_ids = [tok.token_to_id(_byte_token(b)) for b in "😀".encode()]
    d = IncrementalDetokenizer(tok)
    assert [d.push(i) for i in byte_ids] == ["", "", "", "😀"]


def _byte_token(b: int) -> str:
    from dflash24.gguf.tokenizer import byte_alphabet
    return byte_alphabet()[b]


def test_detokenizer_truncated_character_flushes_replacement(tok):
    ids = [tok.token_to_id(_byte_token(b)) for b in "😀".encode()[:2]]
    d = IncrementalDetokenizer(tok)
    assert d.push(ids[0]) == "" and d.push(ids[1]) == ""
    assert d.flush() == "\ufffd" == tok.decode(ids)
    assert d.push(tok.encode("ok")[0]) == "ok"            # usable again after flush


def test_unsupported_tokenizer_model():
    meta = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": ["<unk>", "a"]}
    with pytest.raises(GGUFError, match="not supported.*SentencePiece"):
        Tokenizer(meta)
    with pytest.raises(GGUFError, match="no tokenizer"):
        Tokenizer({})


def _tiny_meta(**extra):
    g = _byte_token
    tokens = [g(b) for b in range(256)] + ["ab", "abc", "<|im_end|>", "<think>"]
    meta = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.merges": ["a b", "ab c"],
            "tokenizer.ggml.token_type": [1] * 258 + [3, 4], "tokenizer.ggml.eos_token_id": 258}
    meta.update(extra)
    return meta


def test_tiny_vocab_and_default_pre_tokenizer(caplog):
    with caplog.at_level("WARNING"):
        tk = Tokenizer(_tiny_meta(**{"tokenizer.ggml.pre": "some-new-model"}))
    assert "unknown pre-tokenizer" in caplog.text
    assert tk.encode("abc<think>ab<|im_end|>") == [257, 259, 256, 258]
    assert tk.eos_token_ids == {258}
    assert tk.decode([257, 259, 258], skip_special_tokens=True) == "abc<think>"


def test_malformed_vocab():
    with pytest.raises(GGUFError, match="malformed merge"):
        Tokenizer(_tiny_meta(**{"tokenizer.ggml.merges": ["ab"]}))
    with pytest.raises(GGUFError, match=r"malformed merge 7 \(expected a string"):
        Tokenizer(_tiny_meta(**{"tokenizer.ggml.merges": [7]}))
    with pytest.raises(GGUFError, match="not a token id"):
        Tokenizer(_tiny_meta(**{"tokenizer.ggml.eos_token_id": 10**6}))
    with pytest.raises(GGUFError, match="token types"):
        Tokenizer(_tiny_meta(**{"tokenizer.ggml.token_type": [1, 1]}))
    with pytest.raises(GGUFError):
        Tokenizer(_tiny_meta(**{"tokenizer.ggml.merges": ["x y"]}))   # merges name tokens not in the vocabulary


def test_duplicate_tokens_warn(caplog):
    meta = _tiny_meta()
    meta["tokenizer.ggml.tokens"] = meta["tokenizer.ggml.tokens"] + ["ab"]
    meta["tokenizer.ggml.token_type"] = meta["tokenizer.ggml.token_type"] + [1]
    with caplog.at_level("WARNING"):
        tk = Tokenizer(meta)
    assert "repeat an earlier token" in caplog.text
    assert tk.encode("ab") == [256] and tk.vocab_size == 261
    d = IncrementalDetokenizer(tk)
    assert d.push(260) == "ab"
