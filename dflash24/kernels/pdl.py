"""Programmatic dependent launch (PDL, sm_90 and later), opt-in with DFLASH24_PDL=1 until timed on a GPU.

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
`**launch_options(device)`: nothing on the CPU, before sm_90, or when the switch is off (the kernels' PDL
constexpr then defaults to False and they compile as before).
"""
from __future__ import annotations

import os

import torch

from . import HAVE_TRITON, tl, triton

ENABLED = os.environ.get("DFLASH24_PDL", "0") == "1"
_CAPABLE: dict = {}


def supported(device: torch.device) -> bool:
    """Whether kernels on `device` are launched with PDL (the switch on, a CUDA device of compute capability 9+)."""
    if not ENABLED or device.type != "cuda":
        return False
    key = device.index if device.index is not None else torch.cuda.current_device()
    if key not in _CAPABLE:
        _CAPABLE[key] = torch.cuda.get_device_capability(key)[0] >= 9
    return _CAPABLE[key]


def launch_options(device: torch.device) -> dict:
    """Keyword arguments for a `kernel[grid](...)` launch on `device`: the PDL constexpr and launch option, or
    nothing (their defaults: off)."""
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
