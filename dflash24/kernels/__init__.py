"""Triton kernels, each with its PyTorch reference beside it or in the model code.

Triton is optional: a CPU-only install runs the references. Every kernel module (these and `quant.kernels`) takes
`triton`, `tl` and `HAVE_TRITON` from here, so the optional import is written once.
"""
try:
    import triton
    import triton.language as tl
    HAVE_TRITON = True
except ImportError:  # CPU-only installs
    triton = None
    tl = None
    HAVE_TRITON = False
