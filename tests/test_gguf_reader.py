"""GGUF reader and writer: round trips, and broken / hostile files fail with clear GGUFErrors."""
import struct

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf import GGUFReader
from gguf.quants import dequantize

from dflash24.gguf.reader import GGUFError, GGUFFile
from dflash24.gguf.writer import quantize_tensor, random_blocks, tensor_nbytes, write_gguf

META = {
    "general.architecture": "qwen2",
    "general.name": "tiny ünïcode 模型",
    "qwen2.block_count": 2,
    "qwen2.rope.freq_base": 1e6,
    "qwen2.attention.layer_norm_rms_epsilon": 1e-6,
    "qwen2.use_bias": True,
    "qwen2.negative": -5,
    "qwen2.big": 2**40,
    "tokenizer.ggml.tokens": ["a", "b", "<|im_end|>"],
    "tokenizer.ggml.token_type": [1, 1, 3],
    "tokenizer.ggml.scores": [0.0, -1.5, 2.25],
    "qwen2.flags": [True, False],
}


def _tensors(rng):
    w = rng.standard_normal((8, 64)).astype(np.float32)
    return [
        ("token_embd.weight", quantize_tensor(w, Q.Q8_0), Q.Q8_0, (8, 64)),
        ("blk.0.attn_q.weight", random_blocks((4, 256), Q.Q4_K, rng), Q.Q4_K, (4, 256)),
        ("blk.0.ffn_down.weight", random_blocks((3, 512), Q.Q6_K, rng), Q.Q6_K, (3, 512)),
        ("blk.0.attn_v.weight", random_blocks((2, 64), Q.Q5_0, rng), Q.Q5_0, (2, 64)),
        ("output_norm.weight", np.arange(64, dtype=np.float32), Q.F32, (64,)),
        ("blk.0.h.weight", rng.standard_normal((2, 3, 32)).astype(np.float16), Q.F16, (2, 3, 32)),
        ("blk.0.bf.weight", random_blocks((5, 32), Q.BF16, rng), Q.BF16, (5, 32)),
    ]


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    path = tmp_path_factory.mktemp("gguf") / "small.gguf"
    rng = np.random.default_rng(1)
    tensors = _tensors(rng)
    write_gguf(path, META, tensors)
    return path, tensors


def test_round_trip(small):
    path, tensors = small
    gf = GGUFFile(path)
    assert gf.arch == "qwen2" and gf.version == 3
    for k, v in META.items():
        got = gf.metadata[k]
        assert got == pytest.approx(v) if isinstance(v, float) or (isinstance(v, list) and isinstance(v[0], float)) else got == v, k
    assert gf.get("block_count") == 2 and gf.require("rope.freq_base") == 1e6
    assert gf.get("tokenizer.ggml.tokens")[2] == "<|im_end|>"
    with pytest.raises(GGUFError, match="qwen2.missing_key"):
        gf.require("missing_key")
    assert list(gf.tensors) == [t[0] for t in tensors]
    for name, data, qtype, shape in tensors:
        ti = gf.tensor(name)
        assert ti.qtype == qtype and ti.shape == shape
        assert ti.n_bytes == tensor_nbytes(qtype, shape)
        assert np.array_equal(ti.data.reshape(-1), np.ascontiguousarray(data).view(np.uint8).reshape(-1))
        assert ti.data.shape[0] == (int(np.prod(shape[:-1])) if len(shape) > 1 else 1)
    emb = dequantize(np.asarray(gf.tensor("token_embd.weight").data), Q.Q8_0)
    assert np.array_equal(emb, dequantize(tensors[0][1], Q.Q8_0))
    with pytest.raises(GGUFError, match="missing"):
        gf.tensor("nope.weight")
    assert gf.weight_bytes() == sum(tensor_nbytes(q, s) for _, _, q, s in tensors)


def test_agrees_with_gguf_py(small):
    path, _ = small
    ours, ref = GGUFFile(path), GGUFReader(path)
    for t in ref.tensors:
        ti = ours.tensors[t.name]
        assert ti.qtype == t.tensor_type and ti.shape == tuple(int(x) for x in reversed(t.shape))
        assert ti.data.ctypes.data - ours._map.ctypes.data == int(t.data_offset)
    assert set(ours.metadata) == {k for k in ref.fields if not k.startswith("GGUF.")}


def test_random_blocks_dequantize_small(small):
    gf = GGUFFile(small[0])
    for name in ("blk.0.attn_q.weight", "blk.0.ffn_down.weight", "blk.0.attn_v.weight"):
        ti = gf.tensor(name)
        w = dequantize(np.asarray(ti.data), ti.qtype)
        assert np.isfinite(w).all() and 0 < np.abs(w).max() < 1.0, name


def test_unknown_architecture_loads(tmp_path):
    path = write_gguf(tmp_path / "x.gguf", {"general.architecture": "mystery-arch-9000", "mystery-arch-9000.n": 1},
                      [("w", np.zeros(32, np.float32), Q.F32, (32,))])
    gf = GGUFFile(path)
    assert gf.arch == "mystery-arch-9000" and gf.get("n") == 1


def test_no_tensors(tmp_path):
    gf = GGUFFile(write_gguf(tmp_path / "v.gguf", {"general.architecture": "qwen2", "tokenizer.ggml.model": "gpt2"}))
    assert gf.tensors == {} and gf.weight_bytes() == 0


def test_writer_rejects_bad_input(tmp_path):
    with pytest.raises(ValueError, match="general.architecture"):
        write_gguf(tmp_path / "a.gguf", {})
    with pytest.raises(ValueError, match="needs"):
        write_gguf(tmp_path / "b.gguf", {"general.architecture": "x"}, [("w", np.zeros(10, np.uint8), Q.Q8_0, (32,))])
    with pytest.raises(ValueError, match="multiple of 32"):
        tensor_nbytes(Q.Q8_0, (2, 33))
    with pytest.raises(TypeError, match="one type"):
        write_gguf(tmp_path / "c.gguf", {"general.architecture": "x", "k": [1, "a"]})


# -- hostile and broken files ---------------------------------------------------------------------------
def _bytes(small):
    return small[0].read_bytes()


def _write(tmp_path, data: bytes, name="bad.gguf"):
    p = tmp_path / name
    p.write_bytes(data)
    return p


def test_missing_file(tmp_path):
    with pytest.raises(GGUFError, match="no such file"):
        GGUFFile(tmp_path / "absent.gguf")


@pytest.mark.parametrize("data", [b"", b"GG", b"GGML" + bytes(100), b"\x00" * 64, b"PK\x03\x04" + bytes(60)])
def test_bad_magic(tmp_path, data):
    with pytest.raises(GGUFError, match="not a GGUF file"):
        GGUFFile(_write(tmp_path, data))


def test_bad_version(tmp_path, small):
    data = bytearray(_bytes(small))
    data[4:8] = struct.pack("<I", 7)
    with pytest.raises(GGUFError, match="unsupported GGUF version 7"):
        GGUFFile(_write(tmp_path, bytes(data)))
    data[4:8] = struct.pack(">I", 3)
    with pytest.raises(GGUFError, match="big-endian"):
        GGUFFile(_write(tmp_path, bytes(data)))


@pytest.mark.parametrize("cut", [4, 6, 8, 16, 23, 24, 40, 100, 300, 600])
def test_truncated_header(tmp_path, small, cut):
    data = _bytes(small)
    gf = GGUFFile(small[0])
    assert cut < gf.data_offset
    with pytest.raises(GGUFError, match="truncated|impossible"):
        GGUFFile(_write(tmp_path, data[:cut]))


def test_every_header_cut_is_a_clear_error(tmp_path, small):
    data = _bytes(small)
    end = GGUFFile(small[0]).data_offset
    for cut in range(4, end, 7):
        with pytest.raises(GGUFError):
            GGUFFile(_write(tmp_path, data[:cut]))


@pytest.mark.parametrize("keep", [-1, -100, -600])
def test_truncated_tensor_data(tmp_path, small, keep):
    data = _bytes(small)
    with pytest.raises(GGUFError, match=r"truncated: tensor .* ends at byte"):
        GGUFFile(_write(tmp_path, data[:keep]))


def _tensor_info_pos(data: bytes, name: str) -> int:
    """Offset just after a tensor's name in the tensor-info section."""
    enc = name.encode()
    i = data.index(struct.pack("<Q", len(enc)) + enc)
    return i + 8 + len(enc)


def test_unknown_tensor_type(tmp_path, small):
    data = bytearray(_bytes(small))
    p = _tensor_info_pos(data, "output_norm.weight")
    n_dims = struct.unpack_from("<I", data, p)[0]
    struct.pack_into("<I", data, p + 4 + 8 * n_dims, 250)
    with pytest.raises(GGUFError, match="'output_norm.weight' has unknown type id 250"):
        GGUFFile(_write(tmp_path, bytes(data)))


def test_absurd_dims_and_shapes(tmp_path, small):
    data = bytearray(_bytes(small))
    p = _tensor_info_pos(data, "output_norm.weight")
    bad = bytearray(data)
    struct.pack_into("<I", bad, p, 9)
    with pytest.raises(GGUFError, match="9 dimensions"):
        GGUFFile(_write(tmp_path, bytes(bad)))
    bad = bytearray(data)
    struct.pack_into("<Q", bad, p + 4, 2**62)                      # ne[0] huge: the data cannot be in the file
    with pytest.raises(GGUFError, match="truncated: tensor 'output_norm.weight'"):
        GGUFFile(_write(tmp_path, bytes(bad)))
    bad = bytearray(data)
    struct.pack_into("<Q", bad, p + 4, 0)
    with pytest.raises(GGUFError, match="invalid shape"):
        GGUFFile(_write(tmp_path, bytes(bad)))
    bad = bytearray(data)
    p = _tensor_info_pos(data, "token_embd.weight")                  # Q8_0 row of 64 -> 48: not a block multiple
    struct.pack_into("<Q", bad, p + 4, 48)
    with pytest.raises(GGUFError, match="not a multiple of its block size 32"):
        GGUFFile(_write(tmp_path, bytes(bad)))


def test_misaligned_tensor_offset(tmp_path, small):
    data = bytearray(_bytes(small))
    p = _tensor_info_pos(data, "output_norm.weight")
    off_pos = p + 4 + 8 + 4
    struct.pack_into("<Q", data, off_pos, struct.unpack_from("<Q", data, off_pos)[0] + 1)
    with pytest.raises(GGUFError, match="not aligned"):
        GGUFFile(_write(tmp_path, bytes(data)))


@pytest.mark.parametrize("field,value,match", [
    (8, 2**63, "tensor count .* impossible"),
    (16, 2**63, "metadata count .* impossible"),
    (16, 10**6, "metadata count .* impossible"),
])
def test_absurd_counts(tmp_path, small, field, value, match):
    data = bytearray(_bytes(small))
    struct.pack_into("<Q", data, field, value)
    with pytest.raises(GGUFError, match=match):
        GGUFFile(_write(tmp_path, bytes(data)))


def _kv_value_pos(data: bytes, key: str) -> int:
    enc = key.encode()
    return data.index(struct.pack("<Q", len(enc)) + enc) + 8 + len(enc)   # at the u32 value type


def test_absurd_lengths_in_metadata(tmp_path, small):
    data = bytearray(_bytes(small))
    p = _kv_value_pos(data, "tokenizer.ggml.tokens")                  # type ARRAY, elem STRING, count
    bad = bytearray(data)
    struct.pack_into("<Q", bad, p + 8, 2**61)
    with pytest.raises(GGUFError, match="truncated header: metadata 'tokenizer.ggml.tokens'"):
        GGUFFile(_write(tmp_path, bytes(bad)))
    bad = bytearray(data)
    struct.pack_into("<Q", bad, p + 16, 2**60)                       # length of the first token string
    with pytest.raises(GGUFError, match=r"tokens'\[0\]"):
        GGUFFile(_write(tmp_path, bytes(bad)))
    p = _kv_value_pos(data, "tokenizer.ggml.scores")                  # float array
    bad = bytearray(data)
    struct.pack_into("<Q", bad, p + 8, 2**62)
    with pytest.raises(GGUFError, match="scores"):
        GGUFFile(_write(tmp_path, bytes(bad)))
    bad = bytearray(data)
    struct.pack_into("<I", bad, p + 4, 99)                            # unknown element type
    with pytest.raises(GGUFError, match="unknown array element type 99"):
        GGUFFile(_write(tmp_path, bytes(bad)))
    p = _kv_value_pos(data, "general.name")
    bad = bytearray(data)
    struct.pack_into("<I", bad, p, 42)                                # unknown value type
    with pytest.raises(GGUFError, match="unknown value type 42"):
        GGUFFile(_write(tmp_path, bytes(bad)))
    bad = bytearray(data)
    struct.pack_into("<Q", bad, p + 4, 2**64 - 1)                      # string length
    with pytest.raises(GGUFError, match="truncated header: metadata 'general.name'"):
        GGUFFile(_write(tmp_path, bytes(bad)))


def test_duplicate_key_and_missing_arch(tmp_path, small):
    data = bytearray(_bytes(small))
    k = data.index(b"qwen2.use_bias")
    data[k:k + 14] = b"qwen2.negative"                               # same length: now a duplicate key
    with pytest.raises(GGUFError, match="'qwen2.negative' appears twice"):
        GGUFFile(_write(tmp_path, bytes(data)))
    data = bytearray(_bytes(small))
    a = data.index(b"general.architecture")
    data[a:a + 20] = b"general.architectur_"
    with pytest.raises(GGUFError, match="lacks general.architecture"):
        GGUFFile(_write(tmp_path, bytes(data)))


def test_bad_alignment(tmp_path):
    p = write_gguf(tmp_path / "al.gguf", {"general.architecture": "x", "general.alignment": 64},
                   [("w", np.zeros(32, np.float32), Q.F32, (32,))])
    gf = GGUFFile(p)
    assert gf.alignment == 64 and gf.data_offset % 64 == 0 and np.all(np.asarray(gf.tensor("w").data) == 0)
    data = bytearray(open(p, "rb").read())
    v = _kv_value_pos(data, "general.alignment")
    struct.pack_into("<I", data, v + 4, 48)
    with pytest.raises(GGUFError, match="not a power of two"):
        GGUFFile(_write(tmp_path, bytes(data)))


def test_random_garbage_never_crashes(tmp_path, small):
    """Random byte flips in the header give a GGUFError or a file that loads, never another exception."""
    rng = np.random.default_rng(0)
    data = _bytes(small)
    end = GGUFFile(small[0]).data_offset
    for trial in range(300):
        bad = bytearray(data)
        for _ in range(rng.integers(1, 4)):
            bad[rng.integers(4, end)] = rng.integers(0, 256)
        p = _write(tmp_path, bytes(bad), f"fuzz{trial % 4}.gguf")
        try:
            GGUFFile(p)
        except GGUFError:
            pass


def test_writer_lazy_tensors(tmp_path):
    calls = []

    def make(i):
        def f():
            calls.append(i)
            return np.full((2, 32), i, np.float32)
        return f

    path = write_gguf(tmp_path / "lazy.gguf", {"general.architecture": "x"},
                      [(f"t{i}", make(i), Q.F32, (2, 32)) for i in range(3)])
    assert calls == [0, 1, 2]
    gf = GGUFFile(path)
    for i in range(3):
        assert np.all(np.asarray(gf.tensor(f"t{i}").data).view(np.float32) == i)
    with pytest.raises(ValueError, match="needs"):
        write_gguf(tmp_path / "lazy2.gguf", {"general.architecture": "x"}, [("t", lambda: np.zeros(3, np.float32), Q.F32, (32,))])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lazy.gguf"]        # no partial file left
