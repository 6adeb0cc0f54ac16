"""The 27B's AR decode and 16-token verify steps under several code policies, interleaved, in ONE process (the
model loads once: an A/B of a launch-level change costs seconds, not a model load per run).

    python benchmarks/ab_steps.py /root/q35.gguf --gpu-mem 24 --order new,old,new,old

Each run applies its policy (module switches, see POLICIES), drops the captured CUDA graphs, recaptures them and
times the graphed steps (CUDA events). Prints one JSON line per run: policy, ms per AR step, per verify of 16, per
tree verify (budget 22, a tree the random drafter built).
`--device cpu` runs the same script eagerly on a small model (its test; the policies change nothing there).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402
from gguf import GGMLQuantizationType as QT  # noqa: E402

from bench_spec import attach_random_drafter, emulate_card, timed  # noqa: E402
from dflash24.kernels import deltanet, norm, pdl  # noqa: E402
from dflash24.models import qwen35  # noqa: E402
from dflash24.quant import gluon_matmul, kernels, linear  # noqa: E402
from dflash24.runner import Graphs  # noqa: E402

_SILU_MUL = norm.silu_mul


def _gate_copied(g, u, *args, **kwargs):
    """silu_mul as it was before the in-place per-head gate: the gate made contiguous first (one copy a layer).
    (The model itself copies it for verify steps, where reading it in place measured slower: so this changes the
    one-token step only.)"""
    return _SILU_MUL(g.reshape(u.shape) if g.dim() == 3 else g, u, *args, **kwargs)


def _cpu_ms(fn, iters: int) -> float:
    t = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - t) * 1e3 / iters


def _gate_padded(g, u, *args, **kwargs):
    """The gate read in place, but a tensor of the copy's size allocated first and kept as long as the result: the
    copy's allocations without the copy (does a verify step's speed follow where its buffers land?)."""
    pad = torch.empty(u.shape, device=u.device, dtype=u.dtype) if g.dim() == 3 and g.shape[0] > 1 else None
    y = _SILU_MUL(g, u, *args, **kwargs)
    if y is not None and pad is not None:
        y.pad = pad
    return y


_PREFETCH_REGS = dict(kernels._GEMV_PREFETCH_REGS)
_DENORM, _NREG, _WG = set(gluon_matmul.DENORM_TILES), dict(gluon_matmul.NREG), set(gluon_matmul.WG_TILES)
_WG_NREG = dict(gluon_matmul.WG_NREG)
_SUM_BLOCK, _SPEC_TILE, _SILU_BLOCK = kernels.SUM_BLOCK, deltanet.SPEC_CHUNK_TILE, norm.SILU_BLOCK
_SPEC_TWO_LOOPS, _PDL_OFF = deltanet.SPEC_CHUNK_TWO_LOOPS, pdl.OFF
_NORM_COLS, _NORM_ROWS = (norm.COLS, norm.VERIFY_COLS), norm.ROWS
_TILES = (dict(gluon_matmul.TILE_BY_SHAPE), {q: dict(t) for q, t in gluon_matmul.TILE.items()})
# the 16-row tiles before the 32-wide ones (2026-12-06, part140)
_TILES_64 = {"shape": {(QT.Q4_K, 34816, 5120, 16): (64, 6, True), (QT.Q4_K, 5120, 17408, 16): (64, 3, True),
                       (QT.Q6_K, 5120, 17408, 16): (64, 6, True), (QT.Q6_K, 1024, 5120, 16): None},
             "type": {QT.Q5_K: (64, 3, True), QT.Q6_K: (64, 3, True)}}


# the light kernels of a step by what they do (policies pdl_off_*)
_LIGHT_KERNELS = {"recurrent": {"_recurrent_kernel"}, "conv": {"_conv_qk_kernel"},
                  "norms": {"_rms_norm_kernel", "_silu_mul_kernel"}, "attn": {"_attn_kernel", "_reduce_kernel"},
                  "sums": {"_sum_partials_kernel"}, "rope": {"_qk_norm_rope_kernel"}}


def _policy(embed_kernel: bool, gate_in_place: bool, tree_index_kernel: bool, gate_copy_from: int = 2,
            silu=None, ahead: int = 1, regs: int = 0, denorm=None, nreg=None, tiles64: bool = False,
            dot_pairs=None, shape_tiles=None, sum_block: int | None = None,
            norm_cols: int | None = None, verify_cols: int | None = None, spec_tile=None,
            waves: float = 1.0, silu_block: int | None = None, norm_rows: int | None = None,
            spec_two_loops: bool | None = None, pdl_off=None, wg=None, wg_nreg=None):
    """ahead: steps the prefetched (ffn_down) GEMVs load ahead (kernels._GEMV_AHEAD, every prefetching type);
    regs: their register cap instead of the shipped per-type caps (0: shipped); denorm: gluon_matmul.DENORM_TILES
    (the verify matmul's (type, tile height) decoded as subnormal bf16; None: shipped); nreg: gluon_matmul.NREG
    (None: shipped); tiles64: the Gluon 16-row tiles as before the 32-wide ones; dot_pairs: kernels.DOT_PAIRS
    (None: shipped, the norms write the dot kernel's pair orders only where a verify matmul may run it; True:
    always, as before);
    shape_tiles: gluon_matmul.TILE_BY_SHAPE entries over the shipped ones; sum_block: kernels.SUM_BLOCK, values a
    program of the split-K sum kernel (None: shipped);
    norm_cols / verify_cols: norm.COLS / VERIFY_COLS, the columns a program of a decode / verify norm writes (None:
    shipped); spec_tile: deltanet.SPEC_CHUNK_TILE (value columns a program, warps) of the speculative-step kernel;
    waves: a factor on every Gluon tile's waves (programs an SM the K split aims for) at 16 and 32 rows;
    silu_block: norm.SILU_BLOCK, columns a silu_mul program; norm_rows: norm.ROWS, rows a norm program at most
    (None: shipped); spec_two_loops: deltanet.SPEC_CHUNK_TWO_LOOPS (False: the speculative-step kernel's state
    products and those among the tokens in one loop, as before 2026-12-06; None: shipped); pdl_off: pdl.OFF, the
    kernels launched without PDL (None: shipped); wg: gluon_matmul.WG_TILES, the (type, tile height) on Hopper's
    warpgroup MMA (None: shipped); wg_nreg: gluon_matmul.WG_NREG, their register caps (None: shipped)."""
    def apply():
        linear.EMBED_KERNEL = embed_kernel
        norm.silu_mul = silu or (_SILU_MUL if gate_in_place else _gate_copied)
        deltanet.TREE_INDEX_KERNEL = tree_index_kernel
        qwen35.GATE_COPY_FROM_TOKENS = gate_copy_from
        kernels._GEMV_AHEAD = {q: ahead for q in _PREFETCH_REGS} if ahead != 1 else {}
        kernels._GEMV_PREFETCH_REGS = {q: regs or r for q, r in _PREFETCH_REGS.items()}
        gluon_matmul.DENORM_TILES = set(_DENORM if denorm is None else denorm)
        gluon_matmul.NREG = dict(_NREG if nreg is None else nreg)
        by_shape, by_type = dict(_TILES[0]), {q: dict(t) for q, t in _TILES[1].items()}
        if tiles64:
            for key, tile in _TILES_64["shape"].items():
                if tile is None:
                    by_shape.pop(key, None)
                else:
                    by_shape[key] = tile
            for q, tile in _TILES_64["type"].items():
                by_type[q][16] = tile
        by_shape.update(shape_tiles or {})
        if waves != 1.0:
            scaled = lambda t: (t[0], max(1, round(t[1] * waves)), t[2])    # noqa: E731
            by_shape = {k: (scaled(t) if k[3] in (16, 32) and t else t) for k, t in by_shape.items()}
            by_type = {q: {h: (scaled(t) if h in (16, 32) else t) for h, t in ts.items()} for q, ts in by_type.items()}
        gluon_matmul.TILE_BY_SHAPE, gluon_matmul.TILE = by_shape, by_type
        kernels.DOT_PAIRS = dot_pairs
        kernels.SUM_BLOCK = _SUM_BLOCK if sum_block is None else sum_block
        norm.COLS = _NORM_COLS[0] if norm_cols is None else norm_cols
        norm.VERIFY_COLS = _NORM_COLS[1] if verify_cols is None else verify_cols
        deltanet.SPEC_CHUNK_TILE = spec_tile or _SPEC_TILE
        deltanet.SPEC_CHUNK_TWO_LOOPS = _SPEC_TWO_LOOPS if spec_two_loops is None else spec_two_loops
        pdl.OFF = _PDL_OFF if pdl_off is None else frozenset(pdl_off)
        norm.SILU_BLOCK = silu_block or _SILU_BLOCK
        norm.ROWS = norm_rows or _NORM_ROWS
        gluon_matmul.WG_TILES = set(_WG if wg is None else wg)
        gluon_matmul.WG_NREG = dict(_WG_NREG if wg_nreg is None else wg_nreg)
    return apply


NEVER = 1 << 30
POLICIES = {
    "new": _policy(True, True, True),              # as shipped
    "old": _policy(False, False, False),           # embedding by gather + PyTorch, the gate copied, tree index ops
    "gate_copied": _policy(True, False, True),     # as shipped but the decode step's attention gate copied first
    "gate_in_place": _policy(True, True, True, NEVER),                     # in place in verify steps too
    "gate_pad": _policy(True, True, True, NEVER, silu=_gate_padded),       # that, with the copy's allocation
    "embed_only": _policy(True, False, False),
    "gate_only": _policy(False, True, False),
    "tree_index_only": _policy(False, False, True),
    "ahead2": _policy(True, True, True, ahead=2, regs=96),     # ffn_down two steps ahead, 96 registers (21 an SM)
    "regs96": _policy(True, True, True, regs=96),               # its control: one step ahead, 96 registers
    "denorm_off": _policy(True, True, True, denorm=(), nreg={}),     # the Gluon decode's two bf16x2 ops a pair
    "denorm_all": _policy(True, True, True, denorm={(q, h) for q in gluon_matmul.TYPES for h in (16, 32, 64)}),
    # as before 2026-12-08: Q4_K's 16 / 32-row tiles and Q8_0's 32-row ones decoded with two / six ops a pair, Q4_K's
    # 16-row tiles uncapped (124 registers); with `q4k_dn16_nocap` Q4_K's 16-row tiles decoded as subnormals uncapped
    "two_fma_q4k": _policy(True, True, True, denorm=_DENORM - {(QT.Q4_K, 16), (QT.Q4_K, 32), (QT.Q8_0, 32)},
                           nreg={k: v for k, v in _NREG.items() if k != (QT.Q4_K, 16)}),
    "q4k_dn16_nocap": _policy(True, True, True, nreg={k: v for k, v in _NREG.items() if k != (QT.Q4_K, 16)}),
    # every verify matmul on Hopper's warpgroup MMA (gluon_matmul.WG_TILES), or its tiles of 32 / 64 rows only
    "wg": _policy(True, True, True, wg={(q, h) for q in gluon_matmul.TYPES for h in (16, 32, 64)}),
    "wg_tall": _policy(True, True, True, wg={(q, h) for q in gluon_matmul.TYPES for h in (32, 64)}),
    "wg_r128": _policy(True, True, True, wg={(q, h) for q in gluon_matmul.TYPES for h in (16, 32, 64)},
                       wg_nreg={(QT.Q4_K, 16): 128, (QT.Q6_K, 16): 128}),
    "tiles64": _policy(True, True, True, tiles64=True),        # the 16-row Gluon tiles 64 wide, as before
    "dot_pairs": _policy(True, True, True, dot_pairs=True),    # the norms also write the dot kernel's pair orders
    # Q4_K's ffn gate / up at 17-32 rows 128 wide, as before the shipped 64-wide ACC2 tile (H100 part141 / part142:
    # 67.60 -> 63.66 us at 23 rows, the tree verify 12.73-12.76 -> 12.65-12.71 ms)
    "q4k_ffn32_128": _policy(True, True, True, shape_tiles={(QT.Q4_K, 34816, 5120, 32): (128, 4, False)}),
    # the split-K sums and the norms' columns and rows as at the start of 2026-12-06 09:34: 1024 values a sum
    # program, 512 norm columns, up to 16 rows a norm program
    "sums_norms_512": _policy(True, True, True, sum_block=1024, norm_cols=512, verify_cols=512, norm_rows=16),
    "sum1024": _policy(True, True, True, sum_block=1024),
    "norm_verify1024": _policy(True, True, True, verify_cols=1024),
    "spec16": _policy(True, True, True, spec_tile=(16, 4)),
    "spec32w2": _policy(True, True, True, spec_tile=(32, 2)),
    # the speculative-step kernel as before 2026-12-06 (32 x 4, one loop, PDL), and the shipped one with PDL / in
    # one loop / 32 x 4
    "spec_before": _policy(True, True, True, spec_tile=(32, 4), spec_two_loops=False,
                           pdl_off=_PDL_OFF - {"_spec_chunk_kernel"}),
    "spec_pdl": _policy(True, True, True, pdl_off=_PDL_OFF - {"_spec_chunk_kernel"}),
    "spec_one_loop": _policy(True, True, True, spec_two_loops=False),
    "spec32": _policy(True, True, True, spec_tile=(32, 4)),
    # other light kernels launched without PDL as well (pdl.OFF): does their grid pile up on the SMs free first?
    **{f"pdl_off_{name}": _policy(True, True, True, pdl_off=_PDL_OFF | set(kernels_off))
       for name, kernels_off in _LIGHT_KERNELS.items()},
    "pdl_off_light": _policy(True, True, True, pdl_off=_PDL_OFF.union(*_LIGHT_KERNELS.values())),
    "waves0.6": _policy(True, True, True, waves=0.6),
    "waves1.5": _policy(True, True, True, waves=1.5),
    "silu256": _policy(True, True, True, silu_block=256),
    "silu512": _policy(True, True, True, silu_block=512),
    "rows1": _policy(True, True, True, norm_rows=1),
    "rows16": _policy(True, True, True, norm_rows=16),      # as before 2026-12-06
}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("gguf")
    ap.add_argument("--gpu-mem", type=float, default=None, help="emulate a card of this many GiB")
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--pos", type=int, default=512)
    ap.add_argument("--iters", type=int, default=100)
    ap.add_argument("--order", default="new,old,new,old", help=f"policies, comma-separated: {', '.join(POLICIES)}")
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    order = args.order.split(",")
    unknown = [p for p in order if p not in POLICIES]
    if unknown:
        ap.error(f"unknown policies {unknown}; known: {', '.join(POLICIES)}")
    cuda = args.device == "cuda"
    if args.gpu_mem and cuda:
        emulate_card(args.gpu_mem)

    from dflash24.config import EngineConfig
    from dflash24.engine import Engine
    t0 = time.perf_counter()
    eng = Engine(EngineConfig(model=args.gguf, ctx=args.ctx, device=args.device))
    attach_random_drafter(eng, 1, args.ctx, "chain", args.device,        # the cache then takes 16-token steps
                          torch.bfloat16 if cuda else torch.float32)
    print(json.dumps({"device": torch.cuda.get_device_name(0) if cuda else args.device,
                      "load_s": round(time.perf_counter() - t0, 1)}), flush=True)
    runner, dev = eng.runner, eng.device
    vocab = eng.model.cfg.vocab_size
    ids = torch.randint(0, min(vocab, 200_000), (args.pos,), device=dev)
    block = torch.randint(0, min(vocab, 200_000), (16,), device=dev)
    draft = eng.draft_runner
    with torch.inference_mode():
        tok = runner.prefill(ids, 0, 512, draft.add_context).argmax(-1).view(1)
        tree = draft.draft_tree(tok, args.pos, 22)
    clock = timed if cuda else _cpu_ms
    for name in order:
        POLICIES[name]()
        runner.graphs = Graphs(cuda)                       # recapture under this policy
        ar = clock(lambda: runner.decode(tok, args.pos), args.iters)
        vf = clock(lambda: runner.forward_fixed(block, args.pos, speculative=True), max(1, args.iters // 3))
        vt = clock(lambda: runner.forward_tree(tree, args.pos), max(1, args.iters // 3))
        print(json.dumps({"policy": name, "ar_ms": round(ar, 4), "verify16_ms": round(vf, 4),
                          "tree23_ms": round(vt, 4),
                          # the warpgroup MMA's tiles still on after the steps (a failure takes them off: kernels)
                          "wg_tiles": len(gluon_matmul.WG_TILES)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
