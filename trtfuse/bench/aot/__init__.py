"""The AOT kernel artifacts' harness: compiled on any machine, launched on a GPU with the bare CUDA driver as
TensorRT launches the ones it embeds, and timed against today's kernels.

    python -m trtfuse.bench.aot compile|check     (cli.py)
    python -m trtfuse.bench.aot.benchmark         (benchmark.py)
"""
