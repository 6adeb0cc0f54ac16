"""Programmatic dependent launch (PDL, sm_90 and later): on by default there, DFLASH24_PDL=0 turns it off.

A kernel launched with it (`launch_pdl`) may be scheduled while the kernel before it in the stream still runs its
last programs, instead of after that kernel has drained: a decode step is some 1,200 short kernels, each with a
ramp-up and a tail. Every kernel of the package that takes `PDL` starts with `pdl_enter`:

- `griddepcontrol.wait` before anything else, so it reads nothing (and overwrites nothing) the kernel before it has
  not finished with; the wait also covers a previous kernel that knows nothing of PDL (a torch op);
- then `griddepcontrol.launch_dependents`, which lets the next kernel be scheduled once every program of this one
  has started, so waiting programs never take the place of programs of the kernel they wait for.

The GEMV and the small-M dot kernel (quant/kernels.py) first ask for their first steps of weights to be prefetched
into L2 (they do not depend on the kernel before), then wait.

The chain holds across kernels: a kernel completes only after its own wait returned. Launch sites pass
`**launch_options(device, kernel)`: nothing on the CPU, before sm_90, when the switch is off, or for a kernel in
`OFF` (the kernels' PDL constexpr then defaults to False and they compile as before; a kernel launched without PDL
starts after the one before it has finished, and the next one's wait covers it).

Measured on an H200 (synthetic 27B Q4_K_M, 24 GiB emulated, 2026-12-02, one call, BENCHMARKS.md): the decode step
8.723 -> 8.519 ms, verify of 16 tokens 19.77 -> 19.36 ms, of 23 tree nodes 31.49 -> 31.16 ms.

A profiler's per-kernel times are not kernel work with it on: a kernel's span then includes its wait for the one
before (benchmarks/profile_steps.py turns it off).
"""
from __future__ import annotations

import os

import torch

from . import HAVE_TRITON, tl, triton

def switched_on(env) -> bool:
    """The switch as set in `env` (os.environ): on unless DFLASH24_PDL is "0"."""
    return env.get("DFLASH24_PDL", "1") != "0"


ENABLED = switched_on(os.environ)
_CAPABLE: dict = {}


def supported(device: torch.device) -> bool:
    """Whether kernels on `device` are launched with PDL (not switched off, a CUDA device of compute capability 9+)."""
    if not ENABLED or device.type != "cuda":
        return False
    key = device.index if device.index is not None else torch.cuda.current_device()
    if key not in _CAPABLE:
        _CAPABLE[key] = torch.cuda.get_device_capability(key)[0] >= 9
    return _CAPABLE[key]


def off_from(env) -> frozenset:
    """The kernels launched without PDL, by function name: OFF_ALWAYS and those DFLASH24_PDL_OFF lists
    (comma-separated) in `env` (os.environ)."""
    return OFF_ALWAYS | frozenset(n.strip() for n in env.get("DFLASH24_PDL_OFF", "").split(",") if n.strip())


# Kernels launched without PDL even where it is supported. The speculative-step kernel at 80-128 registers a thread
# made the 27B's 16-token verify 10.35 ms with PDL and 10.04 ms without (an H100, BENCHMARKS.md 2026-12-06 11:50;
# alone it is 1.7 us faster than the form it replaced). The likely reason: a light grid scheduled early, while the
# kernel before it still runs, piles up on the few SMs that come free first; launched after that kernel, it
# spreads over all of them.
OFF_ALWAYS = frozenset({"_spec_chunk_kernel"})
OFF = off_from(os.environ)


def launch_options(device: torch.device, kernel=None) -> dict:
    """Keyword arguments for a `kernel[grid](...)` launch on `device`: the PDL constexpr and launch option, or
    nothing (their defaults: off) where PDL is not supported or `kernel` is in OFF."""
    if kernel is not None and getattr(kernel, "fn", kernel).__name__ in OFF:
        return {}
    return {"PDL": True, "launch_pdl": True} if supported(device) else {}


if HAVE_TRITON:

    @triton.jit
    def pdl_enter(PDL: tl.constexpr):
        """A PDL kernel's first statement (module docstring); nothing when PDL is off."""
        if PDL:
            tl.extra.cuda.gdc_wait()
            tl.extra.cuda.gdc_launch_dependents()
else:
    pdl_enter = None
