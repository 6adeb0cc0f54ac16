"""The CUDA code path of a whole qwen35 forward, run on the CPU by Triton's interpreter.

On CUDA every piece of a target forward takes a Triton kernel: packed block matmuls (int8 GEMV at M=1, tl.dot
for M <= 64), cache attention, RMSNorm, the DeltaNet conv + q/k norms, the recurrent step. Each kernel has
its own test against its reference; this one checks that they fit together: the same tiny Q8_0 model with
every CUDA path forced on (device checks patched) gives the logits of the reference path over a chunked
prefill and a speculative chain verify (to fp32 rounding), and within the int8-activation bound of the GEMV
over decode steps.
"""
from __future__ import annotations

import math

import pytest
import torch

pytest.importorskip("triton")
transformers = pytest.importorskip("transformers")
if torch.cuda.is_available():      # the real paths run there (tests marked gpu); this simulates them on a CPU
    pytest.skip("simulates the CUDA paths in Triton's interpreter (CPU only)", allow_module_level=True)

from transformers.models.qwen3_5 import Qwen3_5ForCausalLM  # noqa: E402

from dflash24.gguf.reader import GGUFFile  # noqa: E402
from dflash24.kernels import deltanet as dn  # noqa: E402
from dflash24.kernels import norm as fused_norm  # noqa: E402
from dflash24.models import layers  # noqa: E402
from dflash24.models import qwen35 as q35  # noqa: E402
from dflash24.models.layers import Step  # noqa: E402
from dflash24.quant import linear  # noqa: E402
from dflash24.spec.ddtree import ancestor_mask  # noqa: E402
from dflash24.synth import tiny_vocab_size, write_qwen35_from_hf  # noqa: E402
from test_qwen35 import _hf_config  # noqa: E402


@pytest.fixture(scope="module")
def q8_gguf(tmp_path_factory):
    torch.manual_seed(0)
    model = Qwen3_5ForCausalLM(_hf_config(head_dim=64, num_hidden_layers=4, linear_value_head_dim=32,
                                          layer_types=["linear_attention", "full_attention"] * 2)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or "A_log" in name or "dt_bias" in name:
                continue
            p.normal_(0, 1.0 / math.sqrt(p.shape[-1]))
    path = tmp_path_factory.mktemp("cuda-on-cpu") / "tiny-q8.gguf"
    return write_qwen35_from_hf(str(path), model.state_dict(), q35.Qwen35Config.from_hf(model.config), qtype="Q8_0")


def _run(gguf):
    """Prefill 40 tokens in chunks of 16, 3 decode steps, then a 5-token speculative chain verify."""
    model = q35.Qwen35Model.from_gguf(GGUFFile(gguf), max_positions=256)
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(0, tiny_vocab_size(), (48,), generator=g)
    cache = model.new_cache(128, torch.float32, "cpu", max_spec_tokens=8)
    out = []
    with torch.no_grad():
        for s in range(0, 40, 16):
            n = min(16, 40 - s)
            h, _ = model(ids[s:s + n], Step.sequential(s, n), cache)
            out.append(model.logits(h))
        for j in range(40, 43):
            h, _ = model(ids[j:j + 1], Step.sequential(j, 1), cache)
            out.append(model.logits(h))
        pos = torch.arange(43, 48)
        h, _ = model(ids[43:48], Step(pos, pos, 48, speculative=True), cache)
        out.append(model.logits(h))
    return model, torch.cat(out)


def _force_cuda_paths(monkeypatch):
    """Every piece of the forward on its CUDA (Triton) path, device checks patched."""
    monkeypatch.setattr(linear, "_use_triton", lambda device: True)        # pack every Q8_0 matrix
    monkeypatch.setattr(linear, "DENSE_BELOW", 0)
    monkeypatch.setattr(Step, "fused", lambda self: layers._fused_attn is not None
                        and (self.mask is None or self.tree is not None))
    monkeypatch.setattr(layers, "_use_fused_norm", lambda x, w, g: fused_norm.supports(x, g))
    monkeypatch.setattr(layers, "_use_fused_rope", lambda x: True)
    monkeypatch.setattr(layers, "_use_fused_act", lambda g, u: True)
    monkeypatch.setattr(q35, "use_fused_conv", lambda x: True)
    monkeypatch.setattr(dn, "_use_triton", lambda x: True)   # the recurrent kernel (T <= 64; speculative steps: the
                                                             # speculative-step kernel where dn.SPEC_CHUNK)


def _tall_gemv_tiles(monkeypatch, *qtypes):
    """The GEMV of these types on 64-row tiles (the rest of its shipped config kept): 32x fewer programs for the
    interpreter than the shipped 2-row tiles; a tile's height does not change a row's sum."""
    from dflash24.quant import kernels
    for qt in qtypes:
        monkeypatch.setitem(kernels._GEMV_TILE, qt, (64,) + kernels._GEMV_TILE[qt][1:])


def test_whole_forward_on_the_cuda_paths(q8_gguf, monkeypatch):
    _, ref = _run(q8_gguf)                                                  # reference paths (CPU)
    launched = _spy_kernels(monkeypatch)
    _force_cuda_paths(monkeypatch)
    model, got = _run(q8_gguf)

    parts = model.blk[0].in_proj.parts                                     # the packed kernels were used, and the
    assert all(part.packed is not None for part in parts) and len(parts) == 1   # four Q8_0 projections stacked
    # rows 0-39 prefill (tl.dot, fp32 here): the reference's values; rows 40-42 decode (int8-activation GEMV):
    # its rounding, about 1e-2 per matmul, compounds over the 4 layers to ~4 % of max; rows 43-47 (chain verify,
    # tl.dot) read the decode rows' keys and states, so they carry some of it
    err = (got - ref).abs()
    scale = ref.abs().max().item()
    assert err[:40].max().item() <= 1e-3 * scale, err[:40].max().item()
    assert err[40:].max().item() <= 8e-2 * scale, err[40:].max().item()
    assert (got.argmax(-1) == ref.argmax(-1)).float().mean().item() >= 0.9
    for kernel in ("_gemv_int8_kernel", "_dot_kernel", "_attn_kernel", "_rms_norm_kernel",
                   "_conv_qk_kernel", "_recurrent_kernel", "_spec_chunk_kernel", "_silu_mul_kernel",
                   "_qk_norm_rope_kernel"):
        assert kernel in launched, (kernel, sorted(set(launched)))
    # the DeltaNet g / beta come from conv_qk's launch, the attention q / k norms, rotary and cache write from one
    for kernel in ("_gate_beta_kernel", "_rope_kernel"):
        assert kernel not in launched, (kernel, sorted(set(launched)))
    # every decode GEMV's x came from a norm or silu_mul that rounded it to int8 already (kernels/norm.py; the
    # DeltaNet value heads are 32 wide here: whole 32-value blocks)
    assert "_quant_x_kernel" not in launched, sorted(set(launched))


def test_verify_keeps_the_raw_rows_from_the_conv_launch(q8_gguf, monkeypatch):
    """A speculative step on the CUDA paths: each DeltaNet layer's conv_qk writes the step's raw rows to the cache's
    commit scratch as it reads them (no copy kernel), and they are the rows the layer's projection made."""
    _force_cuda_paths(monkeypatch)
    seen, conv = [], q35.conv_qk

    def spy(x, *a, record=None, **kw):
        out = conv(x, *a, record=record, **kw)
        if record is not None:
            seen.append((x.clone(), record))
        return out

    monkeypatch.setattr(q35, "conv_qk", spy)
    model = q35.Qwen35Model.from_gguf(GGUFFile(q8_gguf), max_positions=64)
    ids = torch.randint(0, tiny_vocab_size(), (12,), generator=torch.Generator().manual_seed(5))
    cache = model.new_cache(32, torch.float32, "cpu", max_spec_tokens=8)
    with torch.no_grad():
        model(ids[:8], Step.sequential(0, 8), cache)
        assert not seen                                                    # sequential steps record nothing
        pos = torch.arange(8, 12)
        model(ids[8:12], Step(pos, pos, 12, speculative=True), cache)
    assert len(seen) == model.n_delta_layers
    for layer, (raw, rows) in enumerate(seen):
        assert rows.data_ptr() == cache.raw_rows(layer, 4).data_ptr()
        assert torch.equal(cache.raw_rows(layer, 4), raw.float())


def test_tree_verify_on_the_cuda_paths(q8_gguf, monkeypatch):
    """A tree verify on the CUDA paths (the speculative-step kernel with the tree's ancestor mask, the tree conv and
    attention) gives the reference path's logits, and every node the logits of its root-to-node path verified as a
    chain (branches at depths 1 and 2)."""
    parents = torch.tensor([-1, 0, 0, 1, 2, 2, 5])
    T = parents.shape[0]
    anc = ancestor_mask(parents, T)
    depth = anc.sum(1) - 1
    ids = torch.randint(0, tiny_vocab_size(), (12 + T,), generator=torch.Generator().manual_seed(9))

    def verify(nodes=None):
        """Logits of the tree (nodes None) or of the chain of `nodes` after a 12-token prefill."""
        model = q35.Qwen35Model.from_gguf(GGUFFile(q8_gguf), max_positions=64)
        cache = model.new_cache(32, torch.float32, "cpu", max_spec_tokens=8, max_tree_nodes=8)
        with torch.no_grad():
            model(ids[:12], Step.sequential(0, 12), cache)
            if nodes is None:
                step = Step(12 + depth, 12 + torch.arange(T), 12 + T, speculative=True, parents=parents,
                            tree=(torch.tensor([12]), anc))
                h, _ = model(ids[12:], step, cache)
            else:
                pos = 12 + torch.arange(len(nodes))
                h, _ = model(ids[12:][nodes], Step(pos, pos, 12 + len(nodes), speculative=True), cache)
            return model.logits(h)

    ref = verify()
    launched = _spy_kernels(monkeypatch)
    _force_cuda_paths(monkeypatch)
    got = verify()
    assert "_spec_chunk_kernel" in launched and "_recurrent_kernel" in launched      # tree step / prefill
    scale = ref.abs().max().item()
    assert (got - ref).abs().max().item() <= 1e-3 * scale
    for leaf in (4, 6):                                                     # paths 0-2-4 and 0-2-5-6
        path = torch.nonzero(anc[leaf]).flatten()
        torch.testing.assert_close(verify(path), got[path], rtol=0, atol=1e-3 * scale)


def _decode_and_verify(gguf):
    """(model, prefill(chunks, cache), run(verify)): 24 prompt tokens prefilled in chunks of 16 + 8, then tokens
    24..29 as six one-token decode steps (verify=False) or one six-token chain verify; their logits."""
    model = q35.Qwen35Model.from_gguf(GGUFFile(gguf), max_positions=256)
    ids = torch.randint(0, tiny_vocab_size(), (30,), generator=torch.Generator().manual_seed(4))

    def prefill(chunks, cache):
        s, h = 0, None
        for n in chunks:
            h, _ = model(ids[s:s + n], Step.sequential(s, n), cache)
            s += n
        return model.logits(h[-1:])

    def run(verify: bool) -> torch.Tensor:
        cache = model.new_cache(128, torch.float32, "cpu", max_spec_tokens=8)
        with torch.no_grad():
            prefill((16, 8), cache)
            if verify:
                pos = torch.arange(24, 30)
                return model.logits(model(ids[24:30], Step(pos, pos, 30, speculative=True), cache)[0])
            return torch.cat([model.logits(model(ids[j:j + 1], Step.sequential(j, 1), cache)[0])
                              for j in range(24, 30)])
    return model, prefill, run


def _spy_kernels(monkeypatch) -> list:
    """The names of the Triton kernels the interpreter runs from here on, in launch order."""
    from triton.runtime.interpreter import InterpretedFunction
    launched, real_run = [], InterpretedFunction.run

    def spy(self, *a, **kw):
        launched.append(self.fn.__name__)
        return real_run(self, *a, **kw)

    monkeypatch.setattr(InterpretedFunction, "run", spy)
    return launched


def _decode_with_and_without_norm_int8(model, steps: int, seed: int, monkeypatch):
    """`steps` one-token decode steps from the start, with the norms' int8 rows (the default) and with
    DFLASH24_NORM_INT8=0: [(logits, kernels launched)] for each, in that order."""
    ids = torch.randint(0, tiny_vocab_size(), (steps,), generator=torch.Generator().manual_seed(seed))
    launched = _spy_kernels(monkeypatch)
    runs = []
    for on in (True, False):
        monkeypatch.setattr(fused_norm, "INT8", on)
        cache = model.new_cache(32, torch.float32, "cpu")
        launched.clear()
        with torch.no_grad():
            logits = torch.cat([model.logits(model(ids[j:j + 1], Step.sequential(j, 1), cache)[0])
                                for j in range(steps)])
        runs.append((logits, list(launched)))
    return runs


def test_int8_rows_of_the_norms_change_no_decode_bit(q8_gguf, monkeypatch):
    """Decode steps whose norms and silu_mul hand their int8 activations to the GEMVs (the default) give the same
    logits, bit for bit, as decode steps where every GEMV rounds its x itself (DFLASH24_NORM_INT8=0), and then no
    quantization kernel runs."""
    from gguf import GGMLQuantizationType as QT

    _force_cuda_paths(monkeypatch)
    _tall_gemv_tiles(monkeypatch, QT.Q8_0)                                # both runs
    model = q35.Qwen35Model.from_gguf(GGUFFile(q8_gguf), max_positions=64)
    (fused, with_rows), (own, without) = _decode_with_and_without_norm_int8(model, 4, 5, monkeypatch)
    assert "_gemv_int8_kernel" in with_rows and "_quant_x_kernel" not in with_rows
    assert without.count("_quant_x_kernel") >= 4 * 5           # 4 steps x (in_proj, out, gate_up, down, head)
    assert torch.equal(fused, own), (fused - own).abs().max().item()


def test_int8_rows_in_a_dense_model(tmp_path, monkeypatch):
    """The same for a dense (qwen2) Q4_K_M model on the CUDA paths: its two norms and silu_mul hand their int8 rows
    on (only the attention output's matmul rounds its own x), and the decode logits are the same bits without them."""
    from gguf import GGMLQuantizationType as QT

    from dflash24.models.dense import DenseModel
    from dflash24.synth import write_preset
    _force_cuda_paths(monkeypatch)
    _tall_gemv_tiles(monkeypatch, QT.Q4_K, QT.Q6_K, QT.Q8_0, QT.Q5_0)       # both runs
    model = DenseModel.from_gguf(GGUFFile(write_preset("qwen2-tiny", str(tmp_path / "d.gguf"))), max_positions=64)
    (fused, with_rows), (own, without) = _decode_with_and_without_norm_int8(model, 3, 6, monkeypatch)
    layers_n = len(model.blk)
    assert with_rows.count("_quant_x_kernel") == 3 * layers_n             # the attention output's only
    assert without.count("_quant_x_kernel") >= 3 * (4 * layers_n + 1)    # qkv, out, gate_up, down; the head
    assert torch.equal(fused, own), (fused - own).abs().max().item()


def test_batch_invariant_decode_equals_chain_verify(q8_gguf, monkeypatch):
    """DFLASH24_BATCH_INVARIANT on the CUDA paths: six one-token decode steps and one six-token chain
    verify of the same tokens give the same logits bit for bit (attention, packed matmuls, norms, DeltaNet conv
    and recurrence), so greedy chain output cannot leave AR output even at a tie; and prefilling the 30 tokens
    in other chunks (as the engine does in 64-token chunks in this mode) gives the same last logits."""
    from gguf import GGMLQuantizationType as QT

    from dflash24.quant import kernels
    _force_cuda_paths(monkeypatch)
    _tall_gemv_tiles(monkeypatch, QT.Q8_0)                                # where the mode is off
    model, prefill, run = _decode_and_verify(q8_gguf)

    for on in (True, False):
        monkeypatch.setattr(kernels, "BATCH_INVARIANT", on)
        monkeypatch.setattr(kernels, "DECODE_MATMUL", "dot" if on else "gemv")
        ar, chain = run(False), run(True)
        if on:
            assert torch.equal(ar, chain), (ar - chain).abs().max().item()
            with torch.no_grad():                # where the prompt is cut into chunks does not matter either
                for chunks in ((10, 10, 10), (30,)):
                    assert torch.equal(prefill(chunks, model.new_cache(128, torch.float32, "cpu")), ar[-1:])
        else:                                   # the default decode rounds activations to int8: not the same bits
            assert not torch.equal(ar, chain)


def test_batch_invariant_mode_prefills_in_small_chunks(monkeypatch, caplog):
    from dflash24.config import EngineConfig
    from dflash24.engine import invariant_prefill
    from dflash24.quant import kernels
    cfg = EngineConfig(prefill_chunk=512)
    assert invariant_prefill(cfg, torch.device("cuda")).prefill_chunk == 512            # mode off
    monkeypatch.setattr(kernels, "BATCH_INVARIANT", True)
    assert invariant_prefill(cfg, torch.device("cpu")).prefill_chunk == 512             # exact anyway on the CPU
    with caplog.at_level("WARNING"):
        assert invariant_prefill(cfg, torch.device("cuda")).prefill_chunk == 64
    assert "chunks of 64 tokens (not 512)" in caplog.text
    assert invariant_prefill(EngineConfig(prefill_chunk=32), torch.device("cuda")).prefill_chunk == 32


def test_mmq_verify_rows_follow_the_decode_rows(q8_gguf, monkeypatch):
    """DFLASH24_SMALL_M_MATMUL=mmq on the CUDA paths: a six-token chain verify rounds activations to int8 as the
    decode GEMV does and sums the same exact block integers, so its logits follow six one-token decode steps to
    fp32 summation order through every layer (1.1e-7 of max here; with the bf16 dot path the activation rounding
    puts them 2.9e-2 apart, measured once: that half costs another 90 s in the interpreter)."""
    from gguf import GGMLQuantizationType as QT

    from dflash24.quant import kernels
    _force_cuda_paths(monkeypatch)
    monkeypatch.setattr(kernels, "SMALL_M_MATMUL", "mmq")
    _tall_gemv_tiles(monkeypatch, QT.Q8_0)                    # 2-row tiles took 160 of the test's 219 s
    _, _, run = _decode_and_verify(q8_gguf)
    ar, chain = run(False), run(True)
    assert (ar - chain).abs().max().item() <= 1e-5 * ar.abs().max().item()


def _pair_rows_setup(monkeypatch) -> list:
    """The CUDA paths with the dot kernel's x first (the K order of its in-register path, the one pair rows give);
    returns the list every small-M dot matmul appends (its type's name, whether it was handed pair rows) to."""
    from dflash24.quant import kernels
    _force_cuda_paths(monkeypatch)
    for qt, (bn, waves, _) in list(kernels._DOT_TILE.items()):
        monkeypatch.setitem(kernels._DOT_TILE, qt, (bn, waves, False))
    handed, real = [], kernels._matmul_dot

    def spy(x, p, cfg, out_dtype, bias, x_pairs=None):
        handed.append((p.qtype.name, x_pairs is not None))
        return real(x, p, cfg, out_dtype, bias, x_pairs=x_pairs)
    monkeypatch.setattr(kernels, "_matmul_dot", spy)
    return handed


def test_pair_rows_of_the_norms_change_no_verify_bit(tmp_path, monkeypatch):
    """A bf16 qwen35 Q4_K_M model (Q4_K, Q5_K, Q6_K matrices) on the CUDA paths: prefill chunks and a chain verify
    whose norms and silu_mul hand their output in the dot kernel's pair order to the small-M matmuls (the default)
    give the same logits, bit for bit, as with DFLASH24_NORM_PAIRS=0, where each matmul permutes x in registers
    (with x as the dot's first operand both meet the products in one K order; the weights-first orientation is
    off here: its in-register path permutes the weights, another K order, checked in test_quant_kernels)."""
    from dflash24.quant import kernels
    from dflash24.synth import write_preset
    handed = _pair_rows_setup(monkeypatch)
    monkeypatch.setattr(kernels, "PAIRS_FROM_TOKENS", 2)       # as shipped, kept explicit: small steps make them
    model = q35.Qwen35Model.from_gguf(GGUFFile(write_preset("qwen35-tiny", str(tmp_path / "t.gguf"))),
                                      dtype=torch.bfloat16, max_positions=64)
    ids = torch.randint(0, tiny_vocab_size(), (14,), generator=torch.Generator().manual_seed(8))
    runs = []
    for on in (True, False):
        monkeypatch.setattr(fused_norm, "PAIRS", on)
        handed.clear()
        cache = model.new_cache(32, torch.bfloat16, "cpu", max_spec_tokens=8)
        with torch.no_grad():
            pre = model.logits(model(ids[:8], Step.sequential(0, 8), cache)[0])
            pos = torch.arange(8, 14)
            ver = model.logits(model(ids[8:14], Step(pos, pos, 14, speculative=True), cache)[0])
        runs.append((torch.cat([pre, ver]), list(handed)))
    (with_pairs, calls_on), (without, calls_off) = runs
    assert not any(given for _, given in calls_off)
    # pair rows reach every matmul whose x a norm / silu_mul made with whole 256-value steps: the Q4_K / Q5_K
    # projections of the 256-wide hidden state and the FFN down (512); not the DeltaNet / attention outputs (192)
    assert {name for name, given in calls_on if given} >= {"Q4_K", "Q5_K", "Q6_K"}, calls_on
    assert torch.equal(with_pairs, without), (with_pairs - without).abs().max().item()


def test_drafter_norm_rows_change_no_draft_bit(tmp_path, monkeypatch):
    """A Q4_K drafter and a packed Q6_K LM head on the CUDA paths: the drafter's norms and silu_mul hand their
    output to the packed matmuls as these read it (drafter.FEED_PACKED, the default: pair order for the block's
    small-M matmuls, int8 rows for a one-token context update's GEMVs) and the block's logits and the cache rows
    are the same, bit for bit, as when every matmul permutes or rounds x itself."""
    from types import SimpleNamespace

    from dflash24.models import drafter as dr
    from dflash24.quant.linear import QuantLinear
    from dflash24.quant.packed import pack
    from dflash24.quant.quantize import read_drafter
    from gguf import GGMLQuantizationType as QT
    from test_quant_kernels import random_raw
    handed = _pair_rows_setup(monkeypatch)
    target = SimpleNamespace(dim=256, n_layers=4, vocab_size=300, ffn_dim=512, n_heads=4, n_kv_heads=2, head_dim=64)
    cfg, sd = read_drafter(dr.make_random_drafter_dir(tmp_path / "d", target, 1, target_layer_ids=(1, 2),
                                                      block_size=8, dtype=torch.float32, seed=3))
    drafter = dr.DFlashDrafter.from_gguf(dr.save_gguf(cfg, sd, tmp_path / "d.gguf", "Q4_K"), dtype=torch.bfloat16)
    assert drafter.blk[0].attn_q.packed is not None and drafter.blk[0].attn_q.qtype == QT.Q4_K
    head = QuantLinear(256, 300, QT.Q6_K, packed=pack(random_raw(QT.Q6_K, 300, 256, generator=torch.Generator()
                                                                 .manual_seed(4), d_scale=0.01), QT.Q6_K, 256))
    g = torch.Generator().manual_seed(5)
    emb = torch.randn(300, 256, generator=g).to(torch.bfloat16)
    feats = torch.randn(6, 512, generator=g).to(torch.bfloat16)
    runs = []
    for on in (True, False):
        monkeypatch.setattr(dr, "FEED_PACKED", on)
        handed.clear()
        cache = drafter.new_cache(16, torch.bfloat16, "cpu")
        with torch.no_grad():
            drafter.add_context(feats[:5], torch.arange(5), cache)        # a few committed tokens' features
            drafter.add_context(feats[5:], torch.arange(5, 6), cache)     # one committed token: the GEMVs
            logits = drafter.draft(torch.tensor([7]), 6, cache, lambda i: emb[i], head)
        runs.append((logits, cache.k.clone(), cache.v.clone(), list(handed)))
    (logits_on, k_on, v_on, calls_on), (logits_off, k_off, v_off, calls_off) = runs
    assert not any(given for _, given in calls_off)
    assert {name for name, given in calls_on if given} == {"Q4_K", "Q6_K"}, calls_on      # the layers, the head
    assert torch.equal(k_on, k_off) and torch.equal(v_on, v_off)
    assert torch.equal(logits_on, logits_off), (logits_on - logits_off).abs().max().item()
