"""Test and benchmark harnesses: the plugin lifecycle driver (lifecycle/), the AOT artifacts' bare-driver check and
benchmark (aot/), the kernel benchmark (kernels.py) and the torch reference they share (reference.py).

Nothing in the runtime packages imports from here; these modules may import torch at module top (the runtime may not).
"""

# The kernel benchmark's parts (`python -m trtfuse.bench.kernels --sections`, `trtfuse bench kernels --section`), here
# so that the CLI lists them without importing torch.
SECTIONS = ("norm", "add_norm", "layer_tail", "quant", "rope", "anchors")
