"""Programmatic dependent launch (dflash24/kernels/pdl.py): which launches get it. Its kernels' griddepcontrol code
is compiled for sm_90 by test_kernel_compile.py (the PDL cases); its speed and correctness on a GPU are measured by
benchmarks/gpu_pending.sh part29."""
import ast
from pathlib import Path

import torch

from dflash24.kernels import pdl


def test_pdl_only_when_switched_on_and_on_sm90(monkeypatch):
    cuda = torch.device("cuda", 0)
    assert pdl.launch_options(torch.device("cpu")) == {}
    monkeypatch.setattr(pdl, "ENABLED", False)
    assert pdl.launch_options(cuda) == {}                       # switched off (DFLASH24_PDL=0): no CUDA query at all
    monkeypatch.setattr(pdl, "ENABLED", True)
    monkeypatch.setattr(pdl, "_CAPABLE", {})
    caps = {0: (8, 6), 1: (9, 0)}
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i: caps[i])
    assert pdl.launch_options(torch.device("cpu")) == {}
    assert pdl.launch_options(cuda) == {}                       # an RTX 3090: griddepcontrol needs sm_90
    assert pdl.launch_options(torch.device("cuda", 1)) == {"PDL": True, "launch_pdl": True}


def test_kernels_in_off_launch_without_pdl(monkeypatch):
    """The kernels named in pdl.OFF (the speculative-step kernel always, more with DFLASH24_PDL_OFF) get no PDL
    options on a device that supports PDL; the others do."""
    from dflash24.kernels import deltanet as dn
    from dflash24.kernels import norm
    cuda = torch.device("cuda", 0)
    monkeypatch.setattr(pdl, "supported", lambda device: device.type == "cuda")
    on = {"PDL": True, "launch_pdl": True}
    assert pdl.launch_options(cuda) == on
    assert pdl.launch_options(cuda, dn._recurrent_kernel) == on
    assert pdl.launch_options(cuda, dn._spec_chunk_kernel) == {}
    assert pdl.launch_options(torch.device("cpu"), dn._recurrent_kernel) == {}
    monkeypatch.setattr(pdl, "OFF", pdl.off_from({"DFLASH24_PDL_OFF": "_recurrent_kernel, _rms_norm_kernel"}))
    assert pdl.launch_options(cuda, dn._recurrent_kernel) == {}
    assert pdl.launch_options(cuda, norm._rms_norm_kernel) == {}
    assert pdl.launch_options(cuda, dn._spec_chunk_kernel) == {} and pdl.launch_options(cuda, dn._conv_qk_kernel) == on
    assert pdl.off_from({}) == pdl.OFF_ALWAYS == {"_spec_chunk_kernel"}


def test_every_launch_names_its_kernel():
    """Each launch site passes the kernel it launches to launch_options, so that pdl.OFF can name it."""
    import re
    for src in KERNEL_SOURCES + ("dflash24/quant/embed.py",):
        text = (Path(__file__).resolve().parent.parent / src).read_text()
        for call in re.finditer(r"launch_options\(([^()]*(?:\([^()]*\))?[^()]*)\)", text):
            args = [a.strip() for a in call.group(1).split(",")]
            assert len(args) == 2 and re.fullmatch(r"_\w+_kernel", args[1]), (src, call.group(0))
            launch = text.rfind(args[1] + "[", 0, call.start())
            assert launch >= 0 and call.start() - launch < 1500, (src, call.group(0))


def test_on_unless_switched_off():
    assert pdl.switched_on({})
    assert pdl.switched_on({"DFLASH24_PDL": "1"})
    assert not pdl.switched_on({"DFLASH24_PDL": "0"})


# --- the invariant PDL rests on: a kernel may start while the one before it still runs, so before its wait it
# reads only weights and writes nothing. Checked on the source: every memory operation a kernel with a PDL argument
# reaches before its wait (pdl_enter, or gdc_wait in the Gluon kernels) must be inside one of these helpers, which
# read weights only.
WEIGHT_READS = {"_prefetch_rows", "_load_step"}
KERNEL_SOURCES = ("dflash24/kernels/attention.py", "dflash24/kernels/deltanet.py", "dflash24/kernels/norm.py",
                  "dflash24/kernels/rope.py", "dflash24/kernels/tree.py", "dflash24/quant/kernels.py",
                  "dflash24/quant/linear.py", "dflash24/quant/gluon_matmul.py")
MEMORY_OPS = {"load", "store", "atomic_add", "atomic_max", "atomic_min", "atomic_cas", "atomic_xchg",
              "inline_asm_elementwise", "_async_load", "async_copy_global_to_shared", "async_load",
              "allocate_shared_memory"}
WAITS = {"pdl_enter", "gdc_wait"}


def _name(call):
    f = call.func
    return f.attr if hasattr(f, "attr") else getattr(f, "id", "")


def _functions(root):
    funcs = {}
    for path in KERNEL_SOURCES:
        for node in ast.walk(ast.parse((root / path).read_text())):
            if isinstance(node, ast.FunctionDef):
                funcs[(path, node.name)] = node
    return funcs


def _violations(stmts, touches, path):
    """(memory operations reached before a wait, whether every path through stmts waited)."""
    bad = []
    for st in stmts:
        if isinstance(st, ast.If):
            b1, w1 = _violations(st.body, touches, path)
            b2, w2 = _violations(st.orelse, touches, path)
            bad += b1 + b2
            # `if PDL: wait`: without PDL there is nothing to wait for
            if (w1 and w2) or ((w1 or w2) and "PDL" in ast.unparse(st.test)):
                return bad, True
            continue
        calls = sorted((n for n in ast.walk(st) if isinstance(n, ast.Call)), key=lambda n: (n.lineno, n.col_offset))
        for c in calls:
            name = _name(c)
            if name in WAITS:
                return bad, True
            if name in WEIGHT_READS:
                continue
            if name in MEMORY_OPS or touches(path, name):
                bad.append(f"{path}:{c.lineno} {name}")
    return bad, False


def test_pdl_kernels_read_only_weights_before_their_wait():
    root = Path(__file__).resolve().parent.parent
    funcs = _functions(root)
    memo = {}

    def touches(path, name, seen=()):
        """Whether helper `name` of the module (transitively) does a memory operation."""
        if (path, name) not in funcs or (path, name) in seen:
            return False
        if (path, name) not in memo:
            calls = [_name(c) for c in ast.walk(funcs[(path, name)]) if isinstance(c, ast.Call)]
            memo[(path, name)] = any(c in MEMORY_OPS or touches(path, c, seen + ((path, name),)) for c in calls)
        return memo[(path, name)]

    kernels = [(p, f) for (p, n), f in funcs.items() if "PDL" in [a.arg for a in f.args.args] and n != "pdl_enter"
               and n.endswith("_kernel")]
    assert len(kernels) >= 20, [f.name for _, f in kernels]
    problems = []
    for path, f in kernels:
        bad, waited = _violations(f.body, touches, path)
        problems += [f"{f.name}: {b}" for b in bad]
        if not waited:
            problems.append(f"{f.name}: no wait on some path")
    assert not problems, problems
