"""Every Triton kernel of the package compiles with the real compiler (TTIR -> TTGIR -> LLVM -> PTX -> cubin)
for the GPUs users run: sm_90 (H100/H200) and sm_86 (RTX 3090, the 24 GB card the product targets), and for
sm_89 (RTX 4090) and sm_80 (A100).

Why: the CPU tests run the kernels in Triton's interpreter (TRITON_INTERPRET=1, set in conftest.py), which
accepts code the compiler rejects (e.g. a constexpr-branched @triton.jit helper returning bf16 on one branch
and fp32 on another). Compiling for a GPU target needs no GPU, so it runs here, in CPU CI.

How: a subprocess, started without TRITON_INTERPRET (Triton reads it at import), replaces
`JITFunction.run` (what `kernel[grid](...)` calls) by a recorder, then calls the package's own launch code
(QuantLinear / gemv / matmul / dequant_rows, attention for decode / verify / tree / prefill over every KV
format, the DeltaNet recurrent / tree / replay kernels, the embedding gather, the DDTree build) on small CPU
tensors with the real shapes' constexprs. The recorder binds each launch's arguments with Triton's own binder for the target
(the same signature, constexprs, int==1 / divisibility-by-16 specializations and options that a real launch
on that GPU would compile), skips the launch (outputs stay garbage; the wrappers' torch epilogues run on CPU
and do not care), and the deduplicated (kernel, specialization, options, arch) set is compiled for each
target in a small process pool. Every compile error is reported (kernel, arch, launch config, the first
lines of the error), as is any kernel whose shared memory exceeds the arch's per-block limit (it would
compile but fail to launch with OutOfResources on that GPU), and any sequential attention step compiled for sm_90
that spills more than STEP_STACK_LIMIT bytes a thread to local memory (read from the cubin with the cuobjdump that
ships with Triton; the report's "stack" column gives each kernel's largest).

The test also fails when a launched kernel was never compiled (a wrapper silently took a reference path)
or when the kernel modules define a @triton.jit function this file does not know about (add it below).

Run by hand, with a summary per kernel and arch:  python tests/test_kernel_compile.py [--archs 90,86]
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# sm_90 and sm_86 compile the full sweep; sm_89 and sm_80 (Triton's sm_86 code path, with sm_80's larger
# shared memory) compile the first launch of the sweep per (kernel, KV formats / weight type): `_light_key`.
FULL_ARCHS = (90, 86)
LIGHT_ARCHS = (89, 80)
# Largest dynamic shared memory one block may opt into (CUDA programming guide, compute capabilities table).
MAX_SHARED = {80: 163 * 1024, 86: 99 * 1024, 89: 99 * 1024, 90: 227 * 1024}
BIG_SHARED = " big-shared"    # a case name's end: compiled only for archs of MAX_SHARED >= attention.BIG_TILE_SHARED
# The attention kernel's sequential steps on sm_90 (`_stack_checked`; the 27B's quantized ones on their tiles among
# them: cases named "... step tiles"): bytes of stack a thread (registers spilled to local memory; cuobjdump
# -res-usage of the cubin) they may take. Loading q through permuted addresses spilled 744-784 in q4_0's chain step
# and made it 3.4x slower (BENCHMARKS.md, 2026-12-07 15:01); the shipped tiles take 0-368 (Triton 3.9).
STEP_STACK_LIMIT = 512

KERNEL_MODULES = ("dflash24.kernels.attention", "dflash24.kernels.deltanet", "dflash24.kernels.norm",
                  "dflash24.kernels.rope", "dflash24.kernels.tree", "dflash24.quant.kernels", "dflash24.quant.linear",
                  "dflash24.quant.embed")
# Kernels the package launches (each must be compiled at least once per arch) ...
LAUNCHED = {
    "dflash24.kernels.attention": {"_attn_kernel", "_reduce_kernel", "_dequant_kernel", "_rotate_kernel"},
    "dflash24.kernels.deltanet": {"_recurrent_kernel", "_spec_chunk_kernel", "_replay_kernel", "_conv_qk_kernel",
                                  "_gate_beta_kernel", "_tree_conv_index_kernel"},
    "dflash24.kernels.norm": {"_rms_norm_kernel", "_silu_mul_kernel"},
    "dflash24.kernels.rope": {"_rope_kernel", "_qk_norm_rope_kernel"},
    "dflash24.kernels.tree": {"_build_tree_kernel"},
    "dflash24.quant.kernels": {"_quant_x_kernel", "_gemv_int8_kernel", "_gemv_two_kernel",
                               "_dot_kernel",
                               "_quant_xm_kernel", "_mmq_kernel",
                               "_dequant_kernel", "_sum_partials_kernel"},
    "dflash24.quant.linear": {"_gather_rows_kernel"},
    "dflash24.quant.embed": {"_embed_rows_kernel"},
}
# ... and @triton.jit helpers they call (compiled inside them).
HELPERS = {
    "dflash24.kernels.attention": {"_load_kv_tile", "_tq3_value", "_block_scales", "_per_word", "_field",
                                   "_join8", "_tq3_magnitudes", "_to_q4_0_order", "_from_q4_0_order"},
    "dflash24.kernels.deltanet": {"_gate_beta_row", "_recurrent_inputs"},
    "dflash24.kernels.norm": {"_norm_input"},
    "dflash24.kernels.rope": {"_norm_rope_row"},
    "dflash24.kernels.tree": {"_key", "_key_value", "_key_index"},
    "dflash24.quant.kernels": {"_shift", "_field", "_field_at", "_load_words", "_halves", "_bytes", "_per_blocks",
                               "_load_scales", "_load_raw", "_affine", "_load_tile", "_store_tile", "_dot_rows",
                               "_tile_rows", "_stream_blocks",
                               "_load_step_words", "_prefetch_rows", "_bf16_pairs", "_bf16_pair_scales", "_pair_codes", "_dot_step",
                               "_rne_bf16",
                               "_dp4a", "_quant_x_tile", "_pair_store", "_int8_block_dot", "_x_words", "_x_scales",
                               "_gemv_rows_step", "_int8_scale", "_row_pair_sums", "_two_rows", "_gemv_two_rows",
                               "_step_tiles", "_pair_step_sums", "_prefetched_pair_sums", "_whole_pair_sums",
                               "_whole_pair_sums_ahead2",
                               "_load_below", "_step_x", "_pair_step", "_x_step_words", "_x_step_scales",
                               "_mmq_pos", "_mmq_codes", "_mmq_load_w", "_mmq_load_scales", "_mmq_accumulate"},
    "dflash24.quant.linear": set(),
    "dflash24.quant.embed": {"_f16_at"},
}
TIMEOUT_S = 900


# ---------------------------------------------------------------------------------------------------
# pytest side
# ---------------------------------------------------------------------------------------------------
def run_worker(archs=FULL_ARCHS + LIGHT_ARCHS, jobs: int | None = None, manual: bool = False) -> dict:
    """Run the sweep + compiles in a fresh interpreter without TRITON_INTERPRET; returns its JSON report."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")        # triton 3.9 warns when unset; 1 = its default
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "report.json"
        cmd = [sys.executable, str(Path(__file__).resolve()), "--archs", ",".join(map(str, archs)),
               "--json", str(out)]
        if jobs:
            cmd += ["--jobs", str(jobs)]
        if manual:
            cmd += ["--manual-signature"]
        p = subprocess.run(cmd, env=env, cwd=str(ROOT), capture_output=True, text=True, timeout=TIMEOUT_S)
        if not out.exists():
            raise AssertionError(f"compile worker failed (rc {p.returncode}):\n{p.stdout[-4000:]}\n{p.stderr[-8000:]}")
        report = json.loads(out.read_text())
    report["stdout"] = p.stdout
    return report


def test_every_kernel_compiles_for_target_gpus():
    pytest.importorskip("triton")
    report = run_worker()
    summary = report["stdout"]
    problems = []
    if report["sweep_errors"]:
        problems.append("launch sweep raised (a wrapper call of this test is out of date?):\n"
                        + "\n".join(report["sweep_errors"]))
    if report["unknown_jit"]:
        problems.append("@triton.jit functions this test does not know (add them to LAUNCHED and the sweep, "
                        "or to HELPERS): " + ", ".join(report["unknown_jit"]))
    if report["missing_jit"]:
        problems.append("kernels listed here but absent from the package (update LAUNCHED / HELPERS): "
                        + ", ".join(report["missing_jit"]))
    for arch in report["archs"]:
        done = set(report["compiled"].get(str(arch), {}))
        want = {n for names in LAUNCHED.values() for n in names}
        if want - done:
            problems.append(f"sm_{arch}: never compiled (a wrapper took a reference path?): "
                            + ", ".join(sorted(want - done)))
    for f in report["failures"]:
        problems.append(f"{f['kernel']} sm_{f['arch']} [{f['case']}] {f['config']}\n    "
                        + "\n    ".join(f["error"].splitlines()))
    for st in report["step_stacks"]:
        if st["stack"] is not None and st["stack"] > STEP_STACK_LIMIT:
            problems.append(f"{st['kernel']} sm_90 [{st['case']}] {st['config']}\n    spills {st['stack']} bytes a "
                            f"thread to local memory (limit {STEP_STACK_LIMIT}: see STEP_STACK_LIMIT)")
    if problems:
        pytest.fail("\n\n".join(problems) + "\n\n" + summary, pytrace=False)
    print(summary)


# ---------------------------------------------------------------------------------------------------
# worker side (python tests/test_kernel_compile.py)
# ---------------------------------------------------------------------------------------------------
class Recorder:
    """Stands in for JITFunction.run: records the compile jobs a launch would need, launches nothing."""

    def __init__(self, full_archs, light_archs, manual: bool):
        self.full_archs, self.light_archs, self.manual = tuple(full_archs), tuple(light_archs), manual
        self.case = "?"
        self.note = "hand-built signatures" if manual else "triton-bound signatures"
        self.jobs = []                      # dicts: kernel, arch, case, config, src args, options
        self.seen = set()
        self.light_seen = set()
        self._backends = {}
        self._binders = {}

    def target(self, arch):
        from triton.backends.compiler import GPUTarget
        return GPUTarget("cuda", arch, 32)

    def backend(self, arch):
        if arch not in self._backends:
            from triton.compiler.compiler import make_backend
            self._backends[arch] = make_backend(self.target(arch))
        return self._backends[arch]

    def run(self, fn, args, kwargs, light_key):
        from triton import knobs
        kwargs = dict(kwargs)
        kwargs["debug"] = kwargs.get("debug", fn.debug) or knobs.runtime.debug
        for name in ("instrumentation_mode", "fpsan_homomorphic_casts"):      # what JITFunction.run adds
            if hasattr(knobs.compilation, name):
                kwargs[name] = getattr(knobs.compilation, name)
        archs = list(self.full_archs)
        if light_key not in self.light_seen:
            self.light_seen.add(light_key)
            archs += list(self.light_archs)
        if kwargs.get("PDL"):               # programmatic dependent launch: griddepcontrol exists from sm_90 on
            archs = [a for a in archs if a >= 90]
        if self.case.endswith(BIG_SHARED):  # a config the wrapper picks only where the device offers the memory
            from dflash24.kernels.attention import BIG_TILE_SHARED
            archs = [a for a in archs if MAX_SHARED[a] >= BIG_TILE_SHARED]
        for arch in archs:
            if not self.manual:
                try:
                    job = self._bind(fn, args, kwargs, arch)
                except (AttributeError, ImportError, KeyError, TypeError, ValueError) as e:
                    # Triton's internals moved (runtime/jit.py): fall back to hand-built signatures
                    self.manual = True
                    self.note = f"Triton's binder failed ({type(e).__name__}: {e}); hand-built signatures"
            if self.manual:
                job = self._manual(fn, args, kwargs, arch)
            key = (fn.__name__, arch, job.pop("key"))
            if key in self.seen:
                continue
            self.seen.add(key)
            job.update(kernel=fn.__name__, arch=arch, case=self.case, fn=fn)
            self.jobs.append(job)

    def _bind(self, fn, args, kwargs, arch):
        """Triton's own launch-time binding (runtime/jit.py JITFunction.run) for this target."""
        from triton.runtime import jit as J
        backend = self.backend(arch)
        bk = (id(fn), arch)
        if bk not in self._binders:
            self._binders[bk] = J.create_function_from_signature(fn.signature, fn.params, backend)
        bound, spec, opts = self._binders[bk](*args, **kwargs)
        key = J.compute_cache_key({}, spec, opts)
        options, signature, constexprs, attrs = fn._pack_args(backend, kwargs, bound, spec, opts)
        return dict(key=key, signature=signature, constexprs=constexprs, attrs=attrs, options=options.__dict__,
                    config=_config(signature, constexprs, options.__dict__))

    def _manual(self, fn, args, kwargs, arch):
        """Fallback (and a check of the above): the signature built by hand from the argument types, no
        value specializations."""
        import inspect

        import torch
        names = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32", torch.float64: "fp64",
                 torch.int8: "i8", torch.uint8: "u8", torch.int16: "i16", torch.int32: "i32", torch.int64: "i64",
                 torch.bool: "i1"}
        params = inspect.signature(fn.fn).parameters
        call_kw = {k: v for k, v in kwargs.items() if k in params}
        options = {k: v for k, v in kwargs.items() if k not in params}
        bound = inspect.signature(fn.fn).bind(*args, **call_kw)
        bound.apply_defaults()
        signature, constexprs = {}, {}
        for i, (name, val) in enumerate(bound.arguments.items()):
            if fn.params[i].is_constexpr or val is None:
                signature[name] = "constexpr"
                constexprs[(i,)] = val
            elif isinstance(val, torch.Tensor):
                signature[name] = "*" + names[val.dtype]
            elif isinstance(val, bool):
                signature[name] = "i1"
            elif isinstance(val, int):
                signature[name] = "i32" if -2 ** 31 <= val < 2 ** 31 else "i64"
            elif isinstance(val, float):
                signature[name] = "fp32"
            else:
                raise TypeError(f"{fn.__name__}: argument {name} of type {type(val).__name__}")
        opts = self.backend(arch).parse_options(options).__dict__
        key = repr((sorted(signature.items()), sorted(constexprs.items()), sorted(opts.items(), key=str)))
        return dict(key=key, signature=signature, constexprs=constexprs, attrs={}, options=opts,
                    config=_config(signature, constexprs, opts))


def _config(signature, constexprs, options) -> str:
    names = list(signature)
    cs = ", ".join(f"{names[p[0]]}={v}" for p, v in sorted(constexprs.items()))
    ptrs = ",".join(f"{n}:{t[1:]}" for n, t in signature.items() if t.startswith("*"))
    return (f"{cs}; num_warps={options.get('num_warps')}, num_stages={options.get('num_stages')}; ptrs {ptrs}")


def _compile_one(i):
    """Compile job i (in a forked pool worker); returns (i, error or None, shared bytes, stack bytes a thread (None:
    unknown), seconds)."""
    import triton
    from triton.compiler import ASTSource
    job = _JOBS[i]
    t0 = time.time()
    # MLIR diagnostics go to fd 2, not into the exception: catch them in a file.
    with tempfile.TemporaryFile(mode="w+b") as err:
        saved = os.dup(2)
        os.dup2(err.fileno(), 2)
        try:
            src = ASTSource(job["fn"], job["signature"], job["constexprs"], job["attrs"])
            k = triton.compile(src, target=_RECORDER.target(job["arch"]), options=job["options"])
            msg = None
            if "cubin" not in k.asm:
                msg = f"no cubin produced (stages: {list(k.asm)})"
            if os.environ.get("DFLASH24_DUMP_PTX"):          # by hand: keep the PTX to read the instructions
                name = f"{job['fn'].__name__}-sm{job['arch']}-{i}.ptx"
                Path(os.environ["DFLASH24_DUMP_PTX"], name).write_text(k.asm.get("ptx", ""))
            shared, stack = k.metadata.shared, _stack_bytes(k.asm["cubin"]) if msg is None else None
        except Exception as e:  # noqa: BLE001 - every compiler failure is a finding
            msg = _describe(e)
            shared = stack = None
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        if msg is not None:
            err.seek(0)
            diag = err.read().decode(errors="replace").strip()
            if diag:
                msg += "\n" + diag
    if msg is None and shared > MAX_SHARED[job["arch"]]:
        msg = (f"uses {shared} bytes of shared memory; sm_{job['arch']} allows {MAX_SHARED[job['arch']]} per "
               f"block: the launch would fail with OutOfResources")
    if msg is not None:
        msg = "\n".join(msg.strip().splitlines()[:25])
    return i, msg, shared, stack, time.time() - t0


def _stack_checked(job) -> bool:
    """Whether STEP_STACK_LIMIT applies to a compile: the attention kernel's sequential steps (decode, chain verify,
    prefill chunks) in a 16-bit compute dtype. Trees (an ancestor tile more) and fp32 caches / queries (twice the
    registers a value) spill more and are not held to it."""
    case = job["case"]
    return (job["kernel"] == "_attn_kernel" and " tree " not in case and "f32" not in case
            and "float32" not in case)


def _stack_bytes(cubin: bytes) -> int | None:
    """Bytes of stack a thread of the kernel in `cubin` takes (what ptxas spilled to local memory, plus any local
    arrays), from `cuobjdump -res-usage` (shipped in triton's NVIDIA backend); None without the tool."""
    import triton
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    if not tool.exists():
        return None
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run([str(tool), "-res-usage", f.name], capture_output=True, text=True).stdout
    found = [int(w.split(":")[1]) for w in out.split() if w.startswith("STACK:")]
    return max(found) if found else None


def _describe(e: BaseException) -> str:
    """The root cause first, then where: one line per frame of the chain of Triton CompilationErrors
    (their own text is a dozen lines of source ending at the offending one)."""
    chain = []
    while e is not None and len(chain) < 10:
        chain.append(e)
        e = e.__cause__ or (e.__context__ if not e.__suppress_context__ else None)
    root = chain[-1]
    where = []
    for c in chain:
        node, src = getattr(c, "node", None), getattr(c, "src", None)
        if hasattr(c, "error_message") and node is not None and hasattr(node, "lineno"):
            line = (src or "").split("\n")[node.lineno - 1].strip() if src else "?"
            where.append(f"  at {node.lineno}:{node.col_offset}: {line}")
    head = getattr(root, "error_message", None) if hasattr(root, "error_message") else None
    text = head or str(root)
    return "\n".join([f"{type(root).__name__}: {text}"] + where)


def _compile_all(n: int, jobs: int) -> list:
    """_compile_one over jobs 0..n-1 in a pool of forked workers (they inherit _JOBS). A compiler crash
    (LLVM abort, segfault) breaks the pool: the jobs left are then compiled one process each, so the
    crash is reported against its kernel."""
    if jobs <= 1 or n <= 1:
        return [_compile_one(i) for i in range(n)]
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor, as_completed
    from concurrent.futures.process import BrokenProcessPool
    ctx = mp.get_context("fork")
    results, retry = {}, []
    with ProcessPoolExecutor(jobs, mp_context=ctx) as ex:
        futures = {ex.submit(_compile_one, i): i for i in range(n)}
        for f in as_completed(futures):
            try:
                r = f.result()
                results[r[0]] = r
            except BrokenProcessPool:
                retry.append(futures[f])
    for i in sorted(retry):
        recv, send = ctx.Pipe(duplex=False)
        p = ctx.Process(target=lambda i=i, send=send: send.send(_compile_one(i)))
        p.start()
        send.close()
        try:
            results[i] = recv.recv()
        except EOFError:
            results[i] = None
        p.join()
        if results[i] is None:
            results[i] = (i, f"the compiler process died (exit code {p.exitcode})", None, None, 0.0)
    return [results[i] for i in sorted(results)]


_JOBS: list = []
_RECORDER = None


# --- the launch sweep: the package's own wrappers, the shapes and dtypes real models give them ----------
def sweep(rec: Recorder, errors: list, only: str | None = None):
    import torch

    def case(name, fn, *a, **kw):
        rec.case = name
        try:
            fn(*a, **kw)
        except Exception as e:  # noqa: BLE001
            import traceback
            errors.append(f"{name}: {type(e).__name__}: {e}\n" + "".join(traceback.format_exc(limit=-3)))

    torch.manual_seed(0)
    cases = (_quant_cases() + _attention_cases() + _deltanet_cases() + _norm_cases() + _rope_cases()
             + _gather_cases() + _tree_cases())
    for c in cases + _pdl_cases(cases):
        if only is None or only in c[0]:
            case(*c)


# One launch of every kernel again with programmatic dependent launch on (kernels/pdl.py, DFLASH24_PDL=1 on sm_90+).
# The GEMV and the dot kernel for every packed type: their L2 prefetch's line count differs per type and config.
PDL_CASES = (*(f"QuantLinear {t} M={m} bf16" for t in ("Q8_0", "Q4_0", "Q5_0", "Q4_K", "Q5_K", "Q6_K") for m in (1, 16)),
             "QuantLinear Q6_K M=16 bf16 W_AS_A", "QuantLinear Q4_K M=23 bf16", "QuantLinear Q4_K M=80 bf16", "QuantLinear Q4_K M=16 bf16 mmq",
             "attention decode D=256 H=24/4 bf16/bf16 splits=5", "attention tree D=256 H=24/4 bf16/bf16 splits=5",
             "deltanet recurrent T=16 tree=True update=False Hk=16 Hv=48",
             "deltanet spec_chunk T=23 tree=True Hk=16 Hv=48", "deltanet replay n_on_device=True Hv=48",
             "deltanet conv_qk T=16 Hk=16 Dk=128", "deltanet conv_qk tree + gate + record T=23 Hk=16 Dk=128 Hv=48",
             "deltanet gate_beta T=16 Hv=48", "QuantLinear Q4_K M=16 bf16 pairs field W_AS_A=False",
             "rms_norm (16, 5120) torch.bfloat16 w=True gate=False", "add_rms_norm (16, 5120) bf16",
             "silu_mul (16, 17408) bf16 sigmoid=True", "add_rms_norm (1, 5120) bf16 int8",
             "rms_norm (1, 48, 128) fp32 gate=bf16 int8", "silu_mul (1, 17408) bf16 sigmoid=False int8",
             "rope T=16 H=4 D=256 rot=64", "QuantEmbedding host gather Q4_K")


def _pdl_cases(cases):
    """The PDL_CASES launched with `pdl.supported` forced on and `pdl.OFF` empty (compiled for sm_90 only:
    Recorder.run)."""
    from dflash24.kernels import pdl

    def with_pdl(fn, *a):             # every kernel, those launched without PDL by default (pdl.OFF) too
        saved = pdl.supported, pdl.OFF
        pdl.supported, pdl.OFF = (lambda device: True), frozenset()
        try:
            fn(*a)
        finally:
            pdl.supported, pdl.OFF = saved

    by_name = {c[0]: c for c in cases}
    missing = [n for n in PDL_CASES if n not in by_name]
    if missing:
        raise KeyError(f"PDL_CASES names no case: {missing}")
    return [(f"{n} PDL", with_pdl, *by_name[n][1:]) for n in PDL_CASES]


def _quant_cases():
    import torch
    from gguf import GGMLQuantizationType as QT

    from dflash24.quant.formats import random_raw
    from dflash24.quant.linear import QuantLinear
    from dflash24.quant.packed import PACKED_TYPES, pack

    out = []
    n, k = 40, 4096                  # K of real layers: the per-step block count G is not clipped
    layers = {}

    def layer(qt):
        if qt not in layers:
            raw = random_raw(qt, n, k, generator=torch.Generator().manual_seed(int(qt)), d_scale=0.01)
            layers[qt] = QuantLinear(k, n, qt, packed=pack(raw, qt, k))
        return layers[qt]

    def forward(qt, m, dtype):
        y = layer(qt)(torch.randn(m, k).to(dtype))
        assert y.shape == (m, n)

    for qt in PACKED_TYPES:
        assert qt in (QT.Q8_0, QT.Q4_0, QT.Q5_0, QT.Q4_K, QT.Q5_K, QT.Q6_K)
        # M = 1 GEMV; 16 / 23 / 64 the tl.dot path (BLOCK_M 16 / 32 / 64); 80 dequantized chunks + matmul.
        for m in (1, 16, 23, 64, 80):
            out.append((f"QuantLinear {qt.name} M={m} bf16", forward, qt, m, torch.bfloat16))
    # the dot kernel's W_AS_A orientation (a launch-config choice, benchmarks/tune_dot.py), BLOCK_M 16 / 32
    def dot_w_as_a(qt, m):
        from dflash24.quant import kernels as K
        x = torch.randn(m, k).to(torch.bfloat16)
        p = layer(qt).packed
        assert K.matmul(x, p, dict(K.dot_config(p, m, x.device), w_as_a=True)).shape == (m, n)

    for qt in PACKED_TYPES:
        for m in (16, 23):
            out.append((f"QuantLinear {qt.name} M={m} bf16 W_AS_A", dot_w_as_a, qt, m))

    # the dot kernel's PAIRS decode (4-bit codes, bf16 x; kernels._DOT_PAIRS ships it for some types) on and off,
    # both orientations
    def dot_pairs(qt, m, pairs, w_as_a):
        from dflash24.quant import kernels as K
        x = torch.randn(m, k).to(torch.bfloat16)
        p = layer(qt).packed
        assert K.matmul(x, p, dict(K.dot_config(p, m, x.device), pairs=pairs, w_as_a=w_as_a)).shape == (m, n)

    for qt in (QT.Q4_0, QT.Q5_0, QT.Q4_K, QT.Q5_K, QT.Q6_K):
        for pairs in (False, True):
            for w_as_a in (False, True):
                out.append((f"QuantLinear {qt.name} M=16 bf16 pairs={pairs} W_AS_A={w_as_a}", dot_pairs, qt, 16,
                            pairs, w_as_a))

    def dot_pairs_lop3(qt, w_as_a):  # PAIRS 3: the decode's mask and or as one lop3 (from _PAIRS_LOP3_FROM rows on)
        from dflash24.quant import kernels as K
        p = layer(qt).packed
        cfg = dict(K.dot_config(p, 23, torch.device("cpu")), pairs=True)
        assert K._pairs(cfg, p, torch.zeros(1, dtype=torch.bfloat16)) == (3 if 32 >= K._PAIRS_LOP3_FROM else 1)
        dot_pairs(qt, 23, True, w_as_a)

    for qt in (QT.Q4_K, QT.Q5_K, QT.Q6_K):
        for w_as_a in (False, True):
            out.append((f"QuantLinear {qt.name} M=23 bf16 pairs lop3 W_AS_A={w_as_a}", dot_pairs_lop3, qt, w_as_a))

    def dot_field(m, w_as_a):  # the PAIRS decode's field form (kernels.PAIRS_FIELD, Q4_K), x in pair order
        from dflash24.quant import kernels as K
        x = torch.randn(m, k).to(torch.bfloat16)
        p = layer(QT.Q4_K).packed
        cfg = dict(K.dot_config(p, m, x.device), pairs=True, w_as_a=w_as_a)
        saved, K.PAIRS_FIELD = K.PAIRS_FIELD, True
        try:
            assert K._pairs(cfg, p, x) == 4
            y = K._matmul_dot(x, p, cfg, torch.float32, None, x_pairs=K.pair_order(x, QT.Q4_K).contiguous())
        finally:
            K.PAIRS_FIELD = saved
        assert y.shape == (m, n)

    for m in (16, 23):
        for w_as_a in (False, True):
            out.append((f"QuantLinear Q4_K M={m} bf16 pairs field W_AS_A={w_as_a}", dot_field, m, w_as_a))

    def dot_xperm(qt, m, w_as_a):  # XPERM: x handed in pair order (the norms' pair_rows), both orientations
        from dflash24.quant import kernels as K
        x = torch.randn(m, k).to(torch.bfloat16)
        p = layer(qt).packed
        cfg = dict(K.dot_config(p, m, x.device), pairs=True, w_as_a=w_as_a)
        y = K._matmul_dot(x, p, cfg, torch.float32, None, x_pairs=K.pair_order(x, qt).contiguous())
        assert y.shape == (m, n)

    for qt in (QT.Q4_0, QT.Q5_0, QT.Q4_K, QT.Q5_K, QT.Q6_K):
        for m in (16, 23):
            for w_as_a in (False, True):
                out.append((f"QuantLinear {qt.name} M={m} bf16 XPERM W_AS_A={w_as_a}", dot_xperm, qt, m, w_as_a))

    def dot_stream(qt, m, w_as_a):  # the STREAM split (kernels._DOT_STREAM) with a register cap (cfg maxnreg)
        from dflash24.quant import kernels as K
        x = torch.randn(m, k).to(torch.bfloat16)
        p = layer(qt).packed
        cfg = dict(K.dot_config(p, m, x.device), pairs=True, w_as_a=w_as_a, maxnreg=128 if m == 16 else 168)
        spt = -(-(k // K.GEOMETRY[qt][0]) // cfg["G"])
        cfg["stream"], cfg["split"] = K.stream_split(-(-n // cfg["BLOCK_N"]), spt, 8)
        y = K._matmul_dot(x, p, cfg, torch.float32, None, x_pairs=K.pair_order(x, qt).contiguous())
        assert y.shape == (m, n)

    for qt in (QT.Q4_K, QT.Q6_K):
        for m in (16, 23):
            for w_as_a in (False, True):
                out.append((f"QuantLinear {qt.name} M={m} bf16 XPERM STREAM maxnreg W_AS_A={w_as_a}", dot_stream, qt,
                            m, w_as_a))

    # the GEMV's scale-word variant for long-K loops (kernels._SCALE_WORDS, used from _GEMV_WORDS_MIN_STEPS steps a
    # program on; K = 4096 here has fewer)
    def gemv_words(qt):
        from dflash24.quant import kernels as K
        x = torch.randn(1, k).to(torch.bfloat16)
        p = layer(qt).packed
        cfg = dict(K.gemv_config(p, x.device), scale_words=K._SCALE_WORDS[qt][0])
        assert K.gemv(x, p, cfg).shape == (1, n)

    for qt in (QT.Q4_K, QT.Q5_K):
        out.append((f"QuantLinear {qt.name} M=1 bf16 long-K scale words", gemv_words, qt))

    # the GEMV's 2-row tile as two one-row tiles sharing x (cfg row_pair), with and without row runs
    def gemv_row_pair(qt, row_run):
        from dflash24.quant import kernels as K
        x = torch.randn(1, k).to(torch.bfloat16)
        p = layer(qt).packed
        cfg = dict(K.gemv_config(p, x.device), BLOCK_N=2, row_pair=True, row_run=row_run)
        assert K.gemv(x, p, cfg).shape == (1, n)

    for qt in (QT.Q8_0, QT.Q4_0, QT.Q5_0, QT.Q4_K, QT.Q5_K, QT.Q6_K):
        for row_run in (False, True):
            out.append((f"QuantLinear {qt.name} M=1 bf16 row pair row_run={row_run}", gemv_row_pair, qt, row_run))

    # two weights of one x whose types differ in one launch (kernels.gemv_two)
    def gemv_two(qa, qb):           # 256 rows: 128 programs, unsplit on the 8 SMs the CPU is counted as
        from dflash24.quant import kernels as K
        x = torch.randn(1, k).to(torch.bfloat16)
        pa, pb = (pack(random_raw(q, 256, k, d_scale=0.01), q, k) for q in (qa, qb))
        ya, yb = K.gemv_two(x, pa, pb, out_dtype=torch.bfloat16)
        assert ya.shape == yb.shape == (1, 256)

    for qa, qb in ((QT.Q5_K, QT.Q4_K), (QT.Q4_K, QT.Q6_K)):
        out.append((f"QuantLinear M=1 bf16 two weights {qa.name} + {qb.name}", gemv_two, qa, qb))

    # the GEMV loop unrolled (cfg unroll, kernels._GEMV_UNROLL)
    def gemv_unroll(qt, unroll):
        from dflash24.quant import kernels as K
        x = torch.randn(1, k).to(torch.bfloat16)
        p = layer(qt).packed
        assert K.gemv(x, p, dict(K.gemv_config(p, x.device), unroll=unroll)).shape == (1, n)

    for qt in (QT.Q4_K, QT.Q5_K, QT.Q6_K):
        for unroll in (2, 4):
            out.append((f"QuantLinear {qt.name} M=1 bf16 unroll={unroll}", gemv_unroll, qt, unroll))

    # the row-pair GEMV with the next step's tiles loaded ahead (cfg prefetch), at the 27B's ffn_down K and at 5120;
    # two weights of one x in one launch with it
    def gemv_prefetch(qt, g, kl, whole=False, ahead=1):
        from dflash24.quant import kernels as K
        x = torch.randn(1, kl).to(torch.bfloat16)
        p = pack(random_raw(qt, 64, kl, d_scale=0.01), qt, kl)
        cfg = dict(K.gemv_config(p, x.device), G=g, split=1, per=kl // K.GEOMETRY[qt][0], prefetch=ahead,
                   whole=whole, maxnreg=K._GEMV_PREFETCH_REGS[qt])
        assert K.gemv(x, p, cfg).shape == (1, 64)

    for qt, gs in ((QT.Q4_K, (8, 16, 32)), (QT.Q5_K, (16, 32)), (QT.Q6_K, (64, 128))):
        for g in gs:
            out.append((f"QuantLinear {qt.name} M=1 bf16 prefetch G={g} K=17408", gemv_prefetch, qt, g, 17408))
        out.append((f"QuantLinear {qt.name} M=1 bf16 prefetch G={gs[-1]} K=5120", gemv_prefetch, qt, gs[-1], 5120))
        g = gs[1] if qt == QT.Q4_K else gs[0]                                  # whole steps at K 17408
        out.append((f"QuantLinear {qt.name} M=1 bf16 prefetch whole G={g} K=17408", gemv_prefetch, qt, g, 17408, True))
        out.append((f"QuantLinear {qt.name} M=1 bf16 prefetch 2 ahead whole G={g} K=17408", gemv_prefetch, qt, g,
                    17408, True, 2))

    def gemv_two_prefetch(qa, qb):
        from dflash24.quant import kernels as K
        x = torch.randn(1, k).to(torch.bfloat16)
        pa, pb = (pack(random_raw(q, 256, k, d_scale=0.01), q, k) for q in (qa, qb))
        real = (K.GEMV_PREFETCH, K._GEMV_PREFETCH_MIN_K)
        K.GEMV_PREFETCH, K._GEMV_PREFETCH_MIN_K = True, 0
        try:
            ya, yb = K.gemv_two(x, pa, pb, out_dtype=torch.bfloat16)
        finally:
            K.GEMV_PREFETCH, K._GEMV_PREFETCH_MIN_K = real
        assert ya.shape == yb.shape == (1, 256)

    out.append(("QuantLinear M=1 bf16 two weights Q5_K + Q4_K prefetch", gemv_two_prefetch, QT.Q5_K, QT.Q4_K))

    # the int8 tensor-core kernel of the small-M matmul (DFLASH24_SMALL_M_MATMUL=mmq), BLOCK_M 16 / 32 / 64
    def mmq(qt, m):
        from dflash24.quant import kernels as K
        x = torch.randn(m, k).to(torch.bfloat16)
        p = layer(qt).packed
        assert K.matmul(x, p, K.mmq_config(p, m, x.device)).shape == (m, n)

    for qt in PACKED_TYPES:
        for m in (2, 16, 23, 64):
            out.append((f"QuantLinear {qt.name} M={m} bf16 mmq", mmq, qt, m))
    # q/k/v biases (qwen2): added in the GEMV / tl.dot store
    def forward_bias(qt, m):
        raw = random_raw(qt, n, k, generator=torch.Generator().manual_seed(7), d_scale=0.01)
        lin = QuantLinear(k, n, qt, packed=pack(raw, qt, k), bias=torch.randn(n))
        assert lin(torch.randn(m, k).to(torch.bfloat16)).shape == (m, n)

    for m in (1, 16):
        out.append((f"QuantLinear Q5_0 M={m} bf16 bias", forward_bias, QT.Q5_0, m))
    # fp16 / fp32 activations (--dtype): each kernel, for a 4-field (Q8_0) and an 8-field (Q4_K) type
    for qt in (QT.Q8_0, QT.Q4_K):
        for dtype in (torch.float16, torch.float32):
            for m in (1, 16, 80):
                out.append((f"QuantLinear {qt.name} M={m} {dtype}", forward, qt, m, dtype))
    return out


def _norm_cases():
    import torch

    from dflash24.kernels import norm

    def run(shape, dtype, weight, gate, out_dtype, int8=False, pairs=False):
        x = torch.randn(*shape).to(dtype)
        w = torch.randn(shape[-1]) if weight else None
        g = (torch.randn(*shape).to(torch.bfloat16 if gate == "bf16" else torch.float32)) if gate else None
        y = norm.rms_norm(x, w, 1e-6, gate=g, out_dtype=out_dtype, int8=int8, pairs=pairs)
        assert y is not None and y.shape == x.shape and hasattr(y, "int8_rows") == int8
        assert hasattr(y, "pair_rows") == pairs

    def add_norm(t, int8=False, pairs=False):
        x, r = torch.randn(t, 5120).to(torch.bfloat16), torch.randn(t, 5120).to(torch.bfloat16)
        s, y = norm.add_rms_norm(x, r, torch.randn(5120), 1e-6, int8=int8, pairs=pairs)
        assert s.shape == y.shape == x.shape and hasattr(y, "int8_rows") == int8 and hasattr(y, "pair_rows") == pairs

    def silu_mul(t, sigmoid=False, int8=False, pairs=False):
        gu = torch.randn(t, 2 * 17408).to(torch.bfloat16)
        y = norm.silu_mul(gu[:, :17408], gu[:, 17408:], sigmoid, int8=int8, pairs=pairs)
        assert y.shape == (t, 17408) and hasattr(y, "int8_rows") == int8 and hasattr(y, "pair_rows") == pairs

    def silu_mul_heads(t, int8=False, pairs=False):   # the attention output gate: heads' halves of [q | gate]
        qg = torch.randn(t, 24 * 512 + 2048).to(torch.bfloat16)[:, :24 * 512].view(t, 24, 512)
        y = norm.silu_mul(qg[..., 256:], torch.randn(t, 24 * 256).to(torch.bfloat16), True, int8=int8, pairs=pairs)
        assert y.shape == (t, 24 * 256) and hasattr(y, "int8_rows") == int8 and hasattr(y, "pair_rows") == pairs

    def gated_strided(t):          # a verify step's DeltaNet gate: each token's heads one row of the projection
        proj = torch.randn(t, 48 * 128 + 10240).to(torch.bfloat16)
        y = norm.rms_norm(torch.randn(t, 48, 128), torch.randn(128), 1e-6, gate=proj[:, 10240:].view(t, 48, 128),
                          out_dtype=torch.bfloat16, pairs=True)
        assert y.shape == (t, 48, 128)

    def gluon_orders_only(fn, *args):   # where the Gluon kernel takes every verify matmul (kernels.dot_pairs_needed)
        from dflash24.quant import kernels
        kernels.DOT_PAIRS = False
        try:
            fn(*args)
        finally:
            kernels.DOT_PAIRS = None

    # 27B hidden (5120) at decode / verify, 0.5B hidden (896), per-head q/k norms (256, 128, 64), the gated
    # DeltaNet norm (fp32 in, gate fp32, bf16 out), no weight
    return [("rms_norm (16, 48, 128) fp32 gate=bf16 token rows of a wider matrix, pairs", gated_strided, 16)] + [
        (f"rms_norm {shape} {dtype} w={w} gate={g}", run, shape, dtype, w, g, od)
            for shape, dtype, w, g, od in (((1, 5120), torch.bfloat16, True, False, None),
                                           ((16, 5120), torch.bfloat16, True, False, None),
                                           ((1, 896), torch.float32, True, False, None),
                                           ((1, 24, 256), torch.bfloat16, True, False, None),
                                           ((16, 32, 128), torch.bfloat16, True, False, None),
                                           ((1, 14, 64), torch.float16, True, False, None),
                                           ((1, 48, 128), torch.float32, True, True, torch.bfloat16),
                                           ((1, 48, 128), torch.float32, True, "bf16", torch.bfloat16),
                                           ((3, 512), torch.bfloat16, False, False, None))] + [
        (f"add_rms_norm ({t}, 5120) bf16", add_norm, t) for t in (1, 16)] + [
        (f"silu_mul ({t}, 17408) bf16 sigmoid={sg}", silu_mul, t, sg) for t in (1, 16) for sg in (False, True)] + [
        # a decode step's norms and silu_mul rounding their output to the GEMVs' int8 activations as well
        ("rms_norm (1, 5120) bf16 int8", run, (1, 5120), torch.bfloat16, True, False, None, True),
        ("rms_norm (1, 48, 128) fp32 gate=bf16 int8", run, (1, 48, 128), torch.float32, True, "bf16", torch.bfloat16,
         True),
        ("add_rms_norm (1, 5120) bf16 int8", add_norm, 1, True)] + [
        (f"silu_mul (1, 17408) bf16 sigmoid={sg} int8", silu_mul, 1, sg, True) for sg in (False, True)] + [
        # a verify step's norms and silu_mul writing their output in the dot kernel's pair orders as well
        ("rms_norm (16, 5120) bf16 pairs", run, (16, 5120), torch.bfloat16, True, False, None, False, True),
        ("rms_norm (16, 48, 128) fp32 gate=bf16 pairs", run, (16, 48, 128), torch.float32, True, "bf16",
         torch.bfloat16, False, True),
        ("add_rms_norm (16, 5120) bf16 pairs", add_norm, 16, False, True)] + [
        (f"silu_mul (16, 17408) bf16 sigmoid={sg} pairs", silu_mul, 16, sg, False, True) for sg in (False, True)] + [
        ("silu_mul (1, 24 heads x 256) bf16 sigmoid int8", silu_mul_heads, 1, True),
        ("silu_mul (16, 24 heads x 256) bf16 sigmoid pairs", silu_mul_heads, 16, False, True),
        ("add_rms_norm (16, 5120) bf16 pairs, Gluon orders only", gluon_orders_only, add_norm, 16, False, True),
        ("silu_mul (16, 17408) bf16 pairs, Gluon orders only", gluon_orders_only, silu_mul, 16, False, False, True)]



def _attention_cases():
    import torch

    from dflash24.cache.kvquant import DENSE_TYPES, FORMAT_CODE, PackedKV, encode
    from dflash24.kernels import attention as A

    out = []
    cap, kv_rows = 640, 512

    def cache(fmt, Hk, D):
        x = torch.randn(cap, Hk, D)
        if fmt in DENSE_TYPES:
            return x.to(DENSE_TYPES[fmt])
        return PackedKV(encode(x, fmt), fmt, D)

    def run(mode, H, Hk, D, kfmt, vfmt, dtype, n_splits, window=0, shared=0, segment_rows=None, ring=0):
        kc, vc = cache(kfmt, Hk, D), cache(vfmt, Hk, D)
        T = {"decode": 1, "verify": 16, "tree": 23, "prefill": 80}[mode]
        q = torch.randn(T, H, D).to(dtype)
        assert A.supports(q, kc, vc)
        win = dict(positions=torch.arange(kv_rows - T, kv_rows), window=window, ring=ring) if window else {}
        if mode == "tree":
            parents = torch.arange(T) - 1 - (torch.arange(T) % 3 == 2).long()        # some branching
            anc = torch.eye(T, dtype=torch.bool)
            for i in range(1, T):
                anc[i] |= anc[int(parents[i])]
            o = A.attention(q, kc, vc, D ** -0.5, kv_rows, base=torch.tensor([kv_rows - T]), ancestors=anc,
                            n_splits=n_splits, **win)
        else:
            # shared: the device's opt-in shared memory per block, as A.attention reads it on a GPU
            codes = tuple(FORMAT_CODE.get(f, 0) for f in (kfmt, vfmt))
            config = A.pick_config(T, H // Hk, D, formats=codes, shared=shared) if shared else None
            o = A.attention(q, kc, vc, D ** -0.5, kv_rows, slots=torch.arange(kv_rows - T, kv_rows),
                            n_splits=n_splits, config=config, segment_rows=segment_rows, **win)
        assert o.shape == q.shape

    # (D, H, Hk): Qwen2.5-0.5B-like (GQA 7), 8B-like / DFlash drafts (GQA 4), Qwen3.5-27B (GQA 6)
    shapes = ((64, 14, 2), (128, 32, 8), (256, 24, 4))
    for D, H, Hk in shapes:
        # dense bf16 (the default): decode without split (n_splits == 1 is specialized) and with splits
        # (+ the 64 of long contexts for the 27B's D = 256); chain verification; tree verification; prefill
        bf16_modes = (("decode", 1), ("decode", 5)) + ((("decode", 64),) if D == 256 else ()) + (
            ("verify", 5), ("tree", 5), ("prefill", 1))
        for mode, n_splits in bf16_modes:
            out.append((f"attention {mode} D={D} H={H}/{Hk} bf16/bf16 splits={n_splits}", run,
                        mode, H, Hk, D, "bf16", "bf16", torch.bfloat16, n_splits))
        # --attn-window: decode with splits, chain verification, tree verification
        for mode, n_splits in (("decode", 5), ("verify", 5), ("tree", 5)):
            out.append((f"attention {mode} D={D} H={H}/{Hk} bf16/bf16 splits={n_splits} window=256", run,
                        mode, H, Hk, D, "bf16", "bf16", torch.bfloat16, n_splits, 256))
        # --cache-type-k/v f32 (ieee dots) and f16; quantized KV per format: decode (BLOCK_M 16) and tree
        # verification (the large BLOCK_M of verify / tree / prefill)
        for fmt, dtype in (("f32", torch.float32), ("f16", torch.float16), ("q8_0", torch.bfloat16),
                           ("q4_0", torch.bfloat16), ("tq3", torch.bfloat16)):
            if fmt == "tq3" and D % 128:
                continue
            for mode in ("decode", "tree") + (("prefill",) if D == 256 and fmt not in ("f32", "f16") else ()):
                n_splits = 1 if mode == "prefill" else 5      # the 27B's prefill chunks take 128-row tiles
                out.append((f"attention {mode} D={D} H={H}/{Hk} {fmt}/{fmt} splits={n_splits}", run,
                            mode, H, Hk, D, fmt, fmt, dtype, n_splits))
    # a drafter's sliding layer in a ring (its rows read as position % ring), the block step, each KV type
    for fmt in ("bf16", "q8_0", "q4_0", "tq3"):
        out.append((f"attention verify D=128 H=32/8 {fmt}/{fmt} splits=5 window=256 ring={cap}", run,
                    "verify", 32, 8, 128, fmt, fmt, torch.bfloat16, 5, 256, 0, None, cap))
    # a quantized prefill chunk over several segments of decoded rows (the dense kernel going on from partials,
    # with one split and several), and on the quantized tiles (segment_rows=0)
    for fmt, n_splits, seg in (("q4_0", 1, 256), ("tq3", 3, 256), ("q8_0", 1, 0), ("tq3", 1, 0)):
        out.append((f"attention prefill D=256 H=24/4 {fmt}/{fmt} splits={n_splits} segment_rows={seg}", run,
                    "prefill", 24, 4, 256, fmt, fmt, torch.bfloat16, n_splits, 0, 0, seg))
    # the 27B's prefill tiles where the device has the shared memory for them (sm_90)
    for fmt in ("bf16", "q8_0", "q4_0"):
        out.append((f"attention prefill D=256 H=24/4 {fmt}/{fmt} splits=1{BIG_SHARED}", run,
                    "prefill", 24, 4, 256, fmt, fmt, torch.bfloat16, 1, 0, 227 * 1024, 0))
    # a chain step's 96 rows in one 128-row tile over a long q8_0 / tq3 cache (LONG_STEP_TILES; sm_90)
    def long_verify(fmt):
        keep, A.LONG_STEP_ROWS = A.LONG_STEP_ROWS, 0          # pick_config's tiles for any cache length
        try:
            run("verify", 24, 4, 256, fmt, fmt, torch.bfloat16, 5, 0, 227 * 1024)
        finally:
            A.LONG_STEP_ROWS = keep

    for fmt in ("q8_0", "tq3"):
        out.append((f"attention verify D=256 H=24/4 {fmt}/{fmt} splits=5 long-cache tiles{BIG_SHARED}", long_verify,
                    fmt))
    # the 27B's decode / chain steps over a quantized cache on sm_90's tiles (STEP_TILES; their stack is checked)
    for fmt in ("q8_0", "q4_0", "tq3"):
        for mode in ("decode", "verify"):
            out.append((f"attention {mode} D=256 H=24/4 {fmt}/{fmt} splits=5 step tiles{BIG_SHARED}", run,
                        mode, 24, 4, 256, fmt, fmt, torch.bfloat16, 5, 0, 227 * 1024))
    # mixed K / V types (dense K with a quantized V among them); quantized KV computed in fp32 (--dtype float32)
    for (D, H, Hk), kfmt, vfmt, dtype, mode in (
            (shapes[1], "q8_0", "q4_0", torch.bfloat16, "decode"),
            (shapes[1], "bf16", "tq3", torch.bfloat16, "decode"),
            (shapes[1], "tq3", "q8_0", torch.bfloat16, "decode"),
            (shapes[2], "q8_0", "q8_0", torch.float32, "tree")):
        out.append((f"attention {mode} D={D} H={H}/{Hk} {kfmt}/{vfmt} {dtype} splits=5", run,
                    mode, H, Hk, D, kfmt, vfmt, dtype, 5))
    return out


def _deltanet_cases():
    import torch

    from dflash24.kernels import deltanet as DN

    out = []

    def recurrent(T, hk, dk, hv, dv, tree, update_state, prefetch=True):
        keep, DN.RECURRENT_PREFETCH = DN.RECURRENT_PREFETCH, prefetch   # DFLASH24_RECURRENT_PREFETCH=0: off
        try:
            _recurrent(T, hk, dk, hv, dv, tree, update_state)
        finally:
            DN.RECURRENT_PREFETCH = keep

    def _recurrent(T, hk, dk, hv, dv, tree, update_state):
        q, k = torch.randn(T, hk, dk), torch.randn(T, hk, dk)
        v, g, beta = torch.randn(T, hv, dv), -torch.rand(T, hv), torch.rand(T, hv)
        state = torch.zeros(hv, dk, dv)
        # speculative steps (tree, or a chain without the state update) record their inputs for the commit
        rec = None if update_state and not tree else [torch.empty_like(t) for t in (k, v, g, beta)]
        if tree:
            parents = torch.arange(T) - 1
            states = torch.empty(T, hv, dk, dv)                  # never touched: the launch is skipped
            o = DN.recurrent_triton(q, k, v, g, beta, state, parents=parents, states=states, record=rec)
        else:
            o = DN.recurrent_triton(q, k, v, g, beta, state, update_state=update_state, record=rec)
        assert o.shape == (T, hv, dv)

    def spec_chunk(T, hk, dk, hv, dv, tree):
        q, k = torch.randn(T, hk, dk), torch.randn(T, hk, dk)
        v, g, beta = torch.randn(T, hv, dv), -torch.rand(T, hv), torch.rand(T, hv)
        rec = [torch.empty_like(t) for t in (k, v, g, beta)]
        anc = torch.ones(T, T, dtype=torch.bool).tril() if tree else None
        o = DN.spec_chunk_triton(q, k, v, g, beta, torch.zeros(hv, dk, dv), ancestors=anc, record=rec)
        assert o.shape == (T, hv, dv)

    def replay(L, M, hk, dk, hv, dv, n_on_device):
        k, v = torch.randn(L, M, hk, dk), torch.randn(L, M, hv, dv)
        g, beta = -torch.rand(L, M, hv), torch.rand(L, M, hv)
        state = torch.zeros(L, hv, dk, dv)
        path = torch.arange(5)
        DN.replay_triton(k, v, g, beta, state, path, torch.tensor(3) if n_on_device else 3)

    # Qwen3.5-27B gated DeltaNet heads: 16 key heads of 128, 48 value heads of 128
    for hk, dk, hv, dv in ((16, 128, 48, 128),):
        for T, tree, upd in ((1, False, True), (16, False, True), (16, False, False), (16, True, False)):
            out.append((f"deltanet recurrent T={T} tree={tree} update={upd} Hk={hk} Hv={hv}", recurrent,
                        T, hk, dk, hv, dv, tree, upd))
        for tree in (False, True):
            out.append((f"deltanet recurrent T=16 tree={tree} update=False Hk={hk} Hv={hv} no prefetch", recurrent,
                        16, hk, dk, hv, dv, tree, False, False))
        for dev_n in (False, True):
            out.append((f"deltanet replay n_on_device={dev_n} Hv={hv}", replay, 3, 17, hk, dk, hv, dv, dev_n))
        for T, tree in ((5, True), (16, False), (23, True), (32, False)):      # tiles of 16 and 32 tokens
            out.append((f"deltanet spec_chunk T={T} tree={tree} Hk={hk} Hv={hv}", spec_chunk, T, hk, dk, hv, dv, tree))

    def conv(T, hk, dk, hv, dv, dtype):
        C = 2 * hk * dk + hv * dv
        y = DN.conv_qk(torch.randn(T, C).to(dtype), torch.zeros(3, C), torch.randn(C, 4), hk, dk)
        assert y is not None and y.shape == (T, C)

    # conv + SiLU + q/k l2 norm: the 27B's heads (bf16 projections) at decode and verify, Qwen3.5-9B-like 64-dim
    for T, hk, dk, hv, dv in ((1, 16, 128, 48, 128), (16, 16, 128, 48, 128), (1, 16, 64, 32, 64)):
        out.append((f"deltanet conv_qk T={T} Hk={hk} Dk={dk}", conv, T, hk, dk, hv, dv, torch.bfloat16))

    def gate_beta(T, hv):
        proj = torch.randn(T, 2 * hv + 8).to(torch.bfloat16)          # column slices of a fused projection
        g, beta = DN.gate_beta(proj[:, :hv], proj[:, hv:2 * hv], -torch.rand(hv), torch.randn(hv), fused=True)
        assert g.shape == beta.shape == (T, hv)

    for T in (1, 16):
        out.append((f"deltanet gate_beta T={T} Hv=48", gate_beta, T, 48))

    def conv_gate(T, hk, dk, hv, dv):
        C = 2 * hk * dk + hv * dv
        proj = torch.randn(T, 2 * hv + 8).to(torch.bfloat16)
        y, g, beta = DN.conv_qk(torch.randn(T, C).to(torch.bfloat16), torch.zeros(3, C), torch.randn(C, 4), hk, dk,
                                gate=(proj[:, :hv], proj[:, hv:2 * hv], -torch.rand(hv), torch.randn(hv)))
        assert y.shape == (T, C) and g.shape == beta.shape == (T, hv)

    for T in (1, 16):
        out.append((f"deltanet conv_qk + gate T={T} Hk=16 Dk=128 Hv=48", conv_gate, T, 16, 128, 48, 128))

    def conv_record(T, hk, dk, hv, dv):             # a speculative step: the raw rows kept as they are read
        C = 2 * hk * dk + hv * dv
        proj = torch.randn(T, 2 * hv + 8).to(torch.bfloat16)
        y, g, beta = DN.conv_qk(torch.randn(T, C).to(torch.bfloat16), torch.zeros(3, C), torch.randn(C, 4), hk, dk,
                                update=False, gate=(proj[:, :hv], proj[:, hv:2 * hv], -torch.rand(hv),
                                                    torch.randn(hv)), record=torch.empty(T, C))
        assert y.shape == (T, C)

    out.append(("deltanet conv_qk + gate + record T=16 Hk=16 Dk=128 Hv=48", conv_record, 16, 16, 128, 48, 128))

    def conv_tree(T, hk, dk, hv, dv):               # a tree step: each node's conv along its ancestors (index)
        C = 2 * hk * dk + hv * dv
        proj = torch.randn(T, 2 * hv + 8).to(torch.bfloat16)
        parents = torch.arange(T) // 2 - 1
        y, g, beta = DN.conv_qk(torch.randn(T, C).to(torch.bfloat16), torch.zeros(3, C), torch.randn(C, 4), hk, dk,
                                update=False, gate=(proj[:, :hv], proj[:, hv:2 * hv], -torch.rand(hv),
                                                    torch.randn(hv)), record=torch.empty(T, C),
                                index=DN.tree_conv_index(parents, 4))
        assert y.shape == (T, C)

    out.append(("deltanet conv_qk tree + gate + record T=23 Hk=16 Dk=128 Hv=48", conv_tree, 23, 16, 128, 48, 128))

    def tree_index(T):                              # a tree step's conv rows, one launch
        assert DN.tree_conv_index_triton(torch.arange(T) // 2 - 1, 4).shape == (T, 4)

    out += [(f"deltanet tree_conv_index T={t}", tree_index, t) for t in (23, 64)]
    return out


def _rope_cases():
    import torch

    from dflash24.kernels import rope
    from dflash24.models.layers import Rotary

    def run(t, heads, d, rot, neox, dtype):
        r = Rotary(rot, 1e7, 64, neox)
        y = rope.rope(torch.randn(t, heads, d).to(dtype), torch.arange(t), r.cos, r.sin, rot, neox)
        assert y is not None and y.shape == (t, heads, d)

    def fused(t, heads, kv_heads, d, rot, neox, norm):
        from dflash24.cache.kv import KVCache
        r = Rotary(rot, 1e7, 64, neox)
        w = torch.rand(2, d).to(torch.bfloat16) if norm else (None, None)
        qkv = torch.randn(t, (heads + 2 * kv_heads) * d).to(torch.bfloat16)
        q, k, v = qkv.split([heads * d, kv_heads * d, kv_heads * d], dim=1)
        rows = KVCache(1, 64, kv_heads, d, torch.bfloat16).dense_layer(0)
        qo = rope.qk_norm_rope_write(q.view(t, heads, d), k.view(t, kv_heads, d), v.view(t, kv_heads, d), w[0], w[1],
                                     1e-6, torch.arange(t), torch.arange(t), r.cos, r.sin, rot, neox, *rows)
        assert qo is not None and qo.shape == (t, heads, d)

    # the 27B's q (24 heads) and k (4) of 256 with 64 rotated; the 0.5B's 64-dim heads, fully rotated
    return [(f"rope T={t} H={h} D={d} rot={rot}", run, t, h, d, rot, neox, torch.bfloat16)
            for t, h, d, rot, neox in ((1, 24, 256, 64, True), (16, 4, 256, 64, True), (1, 14, 64, 64, True),
                                      (1, 32, 128, 128, False))] + \
        [(f"q/k norm + rope + cache write T={t} H={h} Hk={hk} D={d} norm={n}", fused, t, h, hk, d, rot, True, n)
         for t, h, hk, d, rot, n in ((1, 24, 4, 256, 64, True), (16, 24, 4, 256, 64, True), (1, 14, 2, 64, 64, False))]


def _gather_cases():
    import torch
    from gguf import GGMLQuantizationType as QT

    from dflash24.quant import linear
    from dflash24.quant.formats import random_raw

    def gather(qt, t=3):
        table = random_raw(qt, 300, 5120, generator=torch.Generator().manual_seed(1))
        emb = linear.QuantEmbedding(table, qt, 5120, torch.bfloat16, host=True)   # the zero-copy path
        emb.device = torch.device("cpu")
        assert emb(torch.arange(t) * 7).shape == (t, 5120)

    def device_table(qt, t=3):                      # a table on the GPU: gathered and decoded in one launch
        from dflash24.quant import embed
        table = random_raw(qt, 300, 5120, generator=torch.Generator().manual_seed(1))
        assert embed.embed_rows(table, torch.arange(t) * 7, qt, 5120, torch.bfloat16).shape == (t, 5120)

    # host tables: the byte gather, then (block types) the decode kernel of quant/embed.py, F16 PyTorch
    return [(f"QuantEmbedding host gather {qt.name}", gather, qt)
            for qt in (QT.Q4_K, QT.Q6_K, QT.Q5_K, QT.Q8_0, QT.Q4_0, QT.Q5_0, QT.F16)] + [
        ("QuantEmbedding host gather Q4_K 64 rows", gather, QT.Q4_K, 64)] + [
        (f"embed_rows device table {qt.name}", device_table, qt)
            for qt in (QT.Q4_K, QT.Q6_K, QT.Q5_K, QT.Q8_0, QT.Q4_0, QT.Q5_0)]


def _tree_cases():
    import torch

    from dflash24.kernels import tree

    def build(depth, k, budget):
        logp, tok = torch.randn(depth, 100).log_softmax(-1).topk(k, -1)
        assert tree.build_tree(torch.tensor([1]), logp, tok, budget)[0].shape == (budget + 1,)

    # the default drafter's 15 positions x top 8 at the shipped budget, the largest budget, and a small tree
    return [(f"ddtree build D={d} K={k} budget={b}", build, d, k, b) for d, k, b in ((15, 8, 22), (15, 8, 127),
                                                                                     (3, 4, 5))]


def _import_kernels():
    """Import the kernel modules. quant/linear.py defines its gather kernel only when CUDA is available:
    pretend it is while that module body runs."""
    import importlib

    import torch
    for name in KERNEL_MODULES:
        if name == "dflash24.quant.linear" and not torch.cuda.is_available():
            for dep in ("dflash24.gguf.reader", "dflash24.quant.formats", "dflash24.quant.packed"):
                importlib.import_module(dep)
            real = torch.cuda.is_available
            torch.cuda.is_available = lambda: True
            try:
                importlib.import_module(name)
            finally:
                torch.cuda.is_available = real
        else:
            importlib.import_module(name)


def _light_key(fn, args, kwargs):
    """Launches that count as one for the light archs (sm_89, sm_80: Triton's sm_86 code path): the kernel
    and its format constexprs (KV formats, weight type). The first such launch of the sweep (bf16) is it."""
    return (fn.__name__, kwargs.get("KFMT"), kwargs.get("VFMT"), kwargs.get("QTYPE"))


def main(argv=None):
    import argparse
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--archs", default=",".join(map(str, FULL_ARCHS + LIGHT_ARCHS)))
    ap.add_argument("--jobs", type=int, default=int(os.environ.get("DFLASH24_COMPILE_JOBS", 0))
                    or min(2, os.cpu_count() or 1), help="compile processes (env DFLASH24_COMPILE_JOBS; default 2)")
    ap.add_argument("--json", help="write the report here")
    ap.add_argument("--only", help="run only the sweep cases whose name contains this (by hand; the "
                    "never-compiled check then fails)")
    ap.add_argument("--manual-signature", action="store_true",
                    help="build signatures by hand instead of with Triton's binder (no value specializations)")
    a = ap.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET", "0") == "1":
        sys.exit("run without TRITON_INTERPRET=1: the interpreter replaces the compiler")
    archs = [int(x) for x in a.archs.split(",") if x]
    full = [x for x in archs if x in FULL_ARCHS or x not in LIGHT_ARCHS]
    light = [x for x in archs if x not in full]
    for x in archs:
        if x not in MAX_SHARED:
            sys.exit(f"unknown arch {x}: add its shared-memory limit to MAX_SHARED")

    t0 = time.time()
    from triton.runtime.jit import JITFunction
    _import_kernels()

    global _RECORDER
    rec = _RECORDER = Recorder(full, light, a.manual_signature)

    def fake_run(self, *args, grid, warmup, **kwargs):
        rec.run(self, args, kwargs, _light_key(self, args, kwargs))
        return None
    JITFunction.run = fake_run

    # which @triton.jit functions exist, against the lists above
    import importlib
    unknown, missing = [], []
    for mod in KERNEL_MODULES:
        m = importlib.import_module(mod)
        have = {n for n, v in vars(m).items() if isinstance(v, JITFunction) and v.__module__ == mod}
        known = LAUNCHED[mod] | HELPERS[mod]
        unknown += [f"{mod}.{n}" for n in sorted(have - known)]
        missing += [f"{mod}.{n}" for n in sorted(known - have)]

    sweep_errors: list = []
    sweep(rec, sweep_errors, a.only)
    _JOBS[:] = rec.jobs
    t_sweep = time.time() - t0

    results = _compile_all(len(_JOBS), a.jobs)

    failures, compiled, per_kernel = [], {}, {}
    for i, msg, shared, stack, secs in results:
        j = _JOBS[i]
        stats = per_kernel.setdefault((j["kernel"], j["arch"]), [0, 0, 0.0, 0, 0])
        stats[0] += 1
        stats[2] += secs
        if msg is None:
            compiled.setdefault(str(j["arch"]), {}).setdefault(j["kernel"], 0)
            compiled[str(j["arch"])][j["kernel"]] += 1
            stats[3] = max(stats[3], shared)
            stats[4] = max(stats[4], stack or 0)
        else:
            stats[1] += 1
            failures.append(dict(kernel=j["kernel"], arch=j["arch"], case=j["case"], config=j["config"], error=msg))

    lines = [f"{len(_JOBS)} compiles ({rec.note}), "
             f"sweep {t_sweep:.1f}s, total {time.time() - t0:.1f}s, {a.jobs} workers; archs full "
             f"{full}, light {light}",
             f"{'kernel':<22}{'arch':>6}{'configs':>9}{'failed':>8}{'max smem':>10}{'stack':>8}{'cpu s':>8}"]
    for (kname, arch), (cnt, bad, secs, shared, stack) in sorted(per_kernel.items()):
        lines.append(f"{kname:<22}{'sm_' + str(arch):>6}{cnt:>9}{bad:>8}{shared:>10}{stack:>8}{secs:>8.1f}")
    slow = sorted(results, key=lambda r: -r[4])[:8]
    lines.append("slowest: " + "; ".join(f"{_JOBS[i]['kernel']} sm_{_JOBS[i]['arch']} [{_JOBS[i]['case']}] {secs:.1f}s"
                                         for i, _, _, _, secs in slow))
    for f in failures:
        lines.append(f"FAIL {f['kernel']} sm_{f['arch']} [{f['case']}] {f['config']}\n    "
                     + "\n    ".join(f["error"].splitlines()[:6]))
    for e in sweep_errors:
        lines.append("SWEEP ERROR " + e.splitlines()[0])
    print("\n".join(lines))
    step_stacks = [dict(kernel=_JOBS[i]["kernel"], case=_JOBS[i]["case"], config=_JOBS[i]["config"], stack=stack)
                   for i, msg, _, stack, _ in results
                   if msg is None and _JOBS[i]["arch"] == 90 and _stack_checked(_JOBS[i])]
    report = dict(archs=archs, failures=failures, compiled=compiled, sweep_errors=sweep_errors,
                  unknown_jit=unknown, missing_jit=missing, n_jobs=len(_JOBS), step_stacks=step_stacks)
    if a.json:
        Path(a.json).write_text(json.dumps(report))
    return 1 if failures or sweep_errors or unknown or missing else 0


if __name__ == "__main__":
    sys.exit(main())
