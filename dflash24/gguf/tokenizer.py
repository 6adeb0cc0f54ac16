"""The tokenizer a GGUF file describes, built with HF `tokenizers` from the file's metadata.

A GGUF carries no `tokenizer.json`; llama.cpp's converter stores the vocabulary under `tokenizer.ggml.*`:
`model` (the algorithm: `gpt2` = byte-level BPE), `pre` (which pre-tokenizer regex the merges were learned
with), `tokens` (id -> token, written in the GPT-2 byte alphabet), `merges` ("left right", best first),
`token_type` (1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte) and the special ids.

Only byte-level BPE (`gpt2`) is supported: it is what every Qwen2.5 / Qwen3 / Qwen3.5 / Qwen3.6 and Llama-3
GGUF uses. SentencePiece vocabularies (`llama`, `t5`, ...) are rejected with a `GGUFError`.
"""
from __future__ import annotations

import codecs
import logging
from functools import lru_cache
from typing import Any, Iterable, Mapping

from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

from .reader import GGUFError

log = logging.getLogger(__name__)

TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNUSED, TOKEN_BYTE = 1, 2, 3, 4, 5, 6

# Pre-tokenizer split patterns, keyed by `tokenizer.ggml.pre` (the names llama.cpp's converter writes).
# Qwen2 splits digits one by one; Llama-3 keeps runs of up to 3 digits; Qwen3.5 also keeps combining
# marks (\p{M}) inside words.
_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN35_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
                 r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
PRE_TOKENIZER_SPLITS: dict[str, str] = {
    "qwen2": _QWEN2_SPLIT,
    "deepseek-r1-qwen": _QWEN2_SPLIT,
    "qwen35": _QWEN35_SPLIT,
    "llama-bpe": _LLAMA3_SPLIT,
    "llama3": _LLAMA3_SPLIT,
    "llama-v3": _LLAMA3_SPLIT,
    "smaug-bpe": _LLAMA3_SPLIT,
    "dbrx": _LLAMA3_SPLIT,
}

# Pre-tokenizers of vocabularies converted from tiktoken whose reference tokenizer (and llama.cpp) first
# looks a whole pre-tokenized piece up in the vocabulary before applying merges (`ignore_merges`).
IGNORE_MERGES_PRE = frozenset({"llama-bpe", "llama3", "llama-v3", "smaug-bpe", "dbrx"})

# Tokens that end a turn or a document. llama.cpp stops on these "end of generation" tokens too, not only
# on `tokenizer.ggml.eos_token_id`: a Qwen chat model ends its reply with <|im_end|> (eos in the file) but
# a base model or a FIM completion ends with <|endoftext|>.
END_TOKENS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|eom_id|>", "<|end_of_text|>", "<|end|>",
              "<end_of_turn>", "<|return|>")


@lru_cache(maxsize=1)
def byte_alphabet() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map (bytes that print as themselves keep their
    character, the other 68 are moved to U+0100 upwards in byte order)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


@lru_cache(maxsize=1)
def _char_to_byte() -> dict[str, int]:
    return {c: b for b, c in byte_alphabet().items()}


def token_text_to_bytes(token: str) -> bytes:
    """The bytes a byte-level token stands for. A token with a character outside the byte alphabet (an
    added token like `<｜User｜>` stored as plain text) stands for its own UTF-8 bytes, as in `tokenizers`'
    ByteLevel decoder."""
    table = _char_to_byte()
    try:
        return bytes(table[c] for c in token)
    except KeyError:
        return token.encode("utf-8")


def _spell(token: str) -> str:
    """A normal vocabulary token in the byte alphabet (a few converters store raw text for some)."""
    table = _char_to_byte()
    if all(c in table for c in token):
        return token
    alphabet = byte_alphabet()
    return "".join(alphabet[b] for b in token.encode("utf-8"))


class Tokenizer:
    """Encode / decode text with the vocabulary of a GGUF file (byte-level BPE).

    Special tokens written in the text (`<|im_start|>`, `<tool_call>`, ...) are always matched whole:
    tokens of type control become special added tokens, tokens of type user-defined plain added tokens.

    `eos_token_ids` is the set of tokens that end generation: `tokenizer.ggml.eos_token_id`,
    `tokenizer.ggml.eot_token_id` and `eom_token_id` when present, plus any of `END_TOKENS`
    (`<|im_end|>`, `<|endoftext|>`, `<|eot_id|>`, `<|eom_id|>`, `<|end_of_text|>`, `<|end|>`,
    `<end_of_turn>`, `<|return|>`) that the vocabulary holds as a control token.
    """

    def __init__(self, metadata: Mapping[str, Any], source: str = "GGUF"):
        def meta(key, default=None):
            return metadata.get(f"tokenizer.ggml.{key}", default)

        kind = meta("model")
        if kind is None:
            raise GGUFError(f"{source}: no tokenizer in the file (metadata tokenizer.ggml.model is missing)")
        if kind != "gpt2":
            raise GGUFError(f"{source}: tokenizer model {kind!r} is not supported; dflash24 supports byte-level "
                            f"BPE ('gpt2', used by Qwen2.5/Qwen3/Qwen3.5/Qwen3.6 and Llama-3 files) only"
                            + (" (SentencePiece 'llama' vocabularies are not)" if kind == "llama" else ""))
        tokens = meta("tokens")
        merges = meta("merges")
        if not tokens or not isinstance(tokens, list):
            raise GGUFError(f"{source}: tokenizer.ggml.tokens is missing or empty")
        if merges is None or not isinstance(merges, list):
            raise GGUFError(f"{source}: byte-level BPE needs tokenizer.ggml.merges, which is missing")
        types = meta("token_type") or [TOKEN_NORMAL] * len(tokens)
        if len(types) != len(tokens):
            raise GGUFError(f"{source}: {len(types)} token types for {len(tokens)} tokens")
        self.vocab_size = len(tokens)
        self._tokens = tokens
        self._types = types

        added_types = (TOKEN_CONTROL, TOKEN_USER_DEFINED)
        vocab: dict[str, int] = {}
        duplicates = []
        for i, (tok, typ) in enumerate(zip(tokens, types)):
            if not isinstance(tok, str):
                raise GGUFError(f"{source}: tokenizer.ggml.tokens[{i}] is not a string")
            text = tok if typ in added_types else _spell(tok)
            if text in vocab:
                duplicates.append(i)        # the first id keeps the text; the later one can only be decoded
            else:
                vocab[text] = i
        if duplicates:
            log.warning("%s: %d token(s) repeat an earlier token (first: id %d %r); encoding uses the first id",
                        source, len(duplicates), duplicates[0], tokens[duplicates[0]])
        pairs = []
        for m in merges:
            if not isinstance(m, str):
                raise GGUFError(f"{source}: malformed merge {m!r} (expected a string 'left right')")
            left, sep, right = m.partition(" ")
            if not sep or not left or not right or " " in right:
                raise GGUFError(f"{source}: malformed merge {m!r} (expected 'left right')")
            pairs.append((left, right))
        try:
            bpe = models.BPE(vocab=vocab, merges=pairs, dropout=None, fuse_unk=False,
                             ignore_merges=(meta("pre") in IGNORE_MERGES_PRE))
        except Exception as e:  # tokenizers raises its own exception type for merges naming unknown tokens
            raise GGUFError(f"{source}: cannot build the BPE model from the vocabulary ({e})") from e
        tk = HFTokenizer(bpe)

        pre = meta("pre") or "default"
        split = PRE_TOKENIZER_SPLITS.get(pre)
        if split is None:
            log.warning("%s: unknown pre-tokenizer %r; using the GPT-2 default split, so token ids may differ "
                        "from the model's own tokenizer", source, pre)
            tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        else:
            tk.pre_tokenizer = pre_tokenizers.Sequence([
                pre_tokenizers.Split(Regex(split), behavior="isolated", invert=False),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ])
        tk.decoder = decoders.ByteLevel()
        # Control tokens first, then user-defined ones; both keep their vocabulary ids.
        tk.add_special_tokens([AddedToken(t, special=True, normalized=False)
                               for t, ty in zip(tokens, types) if ty == TOKEN_CONTROL])
        tk.add_tokens([AddedToken(t, special=False, normalized=False)
                       for t, ty in zip(tokens, types) if ty == TOKEN_USER_DEFINED])
        self.hf = tk
        self.pre = pre
        self.special_ids = frozenset(i for i, ty in enumerate(types) if ty == TOKEN_CONTROL)

        def valid_id(key):
            v = meta(key)
            if v is None:
                return None
            if not isinstance(v, int) or not 0 <= v < len(tokens):
                raise GGUFError(f"{source}: tokenizer.ggml.{key} = {v!r} is not a token id (vocabulary of {len(tokens)})")
            return v

        self.bos_token_id = valid_id("bos_token_id")
        self.eos_token_id = valid_id("eos_token_id")
        self.pad_token_id = valid_id("padding_token_id")
        self.add_bos = bool(meta("add_bos_token", False)) and self.bos_token_id is not None
        eos = {valid_id(k) for k in ("eos_token_id", "eot_token_id", "eom_token_id")} - {None}
        for name in END_TOKENS:
            i = vocab.get(name)
            if i is not None and types[i] == TOKEN_CONTROL:
                eos.add(i)
        self.eos_token_ids: set[int] = eos
        self._bytes_cache: dict[int, bytes] = {}

    @classmethod
    def from_gguf(cls, gf) -> "Tokenizer":
        """From an open `GGUFFile`."""
        return cls(gf.metadata, source=gf.path)

    # -- text <-> ids --------------------------------------------------------------------------------
    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids of `text`. Special tokens written in the text are recognised. With
        `add_special_tokens`, BOS is prepended when the file asks for it (`add_bos`)."""
        if not isinstance(text, str):
            raise TypeError(f"encode() takes a str, got {type(text).__name__}")
        ids = self.hf.encode(text, add_special_tokens=False).ids
        if add_special_tokens and self.add_bos:
            ids = [self.bos_token_id, *ids]
        return ids

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        ids = self._check_ids(ids)
        return self.hf.decode(ids, skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        return self.hf.token_to_id(token)

    def id_to_token(self, token_id: int) -> str:
        self._check_ids([token_id])
        return self._tokens[token_id]

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes of text one token stands for (what it adds to a decode)."""
        b = self._bytes_cache.get(token_id)
        if b is None:
            self._check_ids([token_id])
            text = self.hf.id_to_token(token_id)
            b = token_text_to_bytes(text if text is not None else self._tokens[token_id])
            self._bytes_cache[token_id] = b
        return b

    def is_special(self, token_id: int) -> bool:
        return token_id in self.special_ids

    def _check_ids(self, ids) -> list[int]:
        ids = [int(i) for i in ids]
        for i in ids:
            if not 0 <= i < self.vocab_size:
                raise ValueError(f"token id {i} is outside the vocabulary (0..{self.vocab_size - 1})")
        return ids

    def __len__(self) -> int:
        return self.vocab_size

    def __repr__(self) -> str:
        return (f"Tokenizer(gpt2/{self.pre}, vocab={self.vocab_size}, bos={self.bos_token_id}, "
                f"add_bos={self.add_bos}, eos={sorted(self.eos_token_ids)})")


class IncrementalDetokenizer:
    """Turn a stream of token ids into text pieces, never splitting a UTF-8 character.

    Each token's bytes go through an incremental UTF-8 decoder, which holds back the bytes of an
    unfinished character (an emoji or CJK character spread over several tokens) until it is complete.
    Work per token is O(its bytes). The concatenation of every `push` and the final `flush` equals
    `tokenizer.decode(all_ids, skip_special_tokens)`; invalid byte sequences become U+FFFD as in decode.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = False):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_id: int) -> str:
        """Text completed by this token ('' while a character is still incomplete)."""
        if self.skip_special_tokens and self.tokenizer.is_special(token_id):
            return ""
        return self._utf8.decode(self.tokenizer.token_bytes(token_id))

    def push_many(self, token_ids: Iterable[int]) -> str:
        return "".join(self.push(t) for t in token_ids)

    def flush(self) -> str:
        """Whatever is held back (an incomplete character at the end becomes U+FFFD); resets the state."""
        out = self._utf8.decode(b"", final=True)
        self._utf8.reset()
        return out
