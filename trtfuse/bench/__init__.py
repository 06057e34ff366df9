"""Test and benchmark harnesses: the plugin lifecycle driver (lifecycle/), the AOT artifacts' bare-driver check and
benchmark (aot/), the kernel benchmark (kernels.py) and the torch reference they share (reference.py).

Nothing in the runtime packages imports from here; these modules may import torch at module top (the runtime may not).
"""
