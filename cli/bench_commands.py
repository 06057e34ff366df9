"""`trtfuse bench kernels`: the CuTeDSL kernel benchmark (trtfuse/kernels/bench.py) from the command line."""

from __future__ import annotations

from pathlib import Path

import click

from trtfuse.errors import MissingDependencyError


@click.group("bench")
def bench() -> None:
    """Benchmarks that need a GPU."""


@bench.command("kernels")
@click.option("--json", "json_path", type=click.Path(path_type=Path), help="Also write the full results here.")
@click.option("--no-torch-compile", is_flag=True, help="Skip the torch.compile baselines (saves their compile time).")
def kernels(json_path: Path | None, no_torch_compile: bool) -> None:
    """RMSNorm / QK-norm kernels against the copy ceiling, torch and torch.compile (docs/performance.md)."""
    try:
        import torch

        from trtfuse.kernels import bench as kernel_bench
    except ImportError as error:
        raise MissingDependencyError(f"the kernel benchmark needs torch and nvidia-cutlass-dsl: {error}") from error
    if not torch.cuda.is_available():
        raise MissingDependencyError("the kernel benchmark needs a CUDA GPU, and torch sees none")
    argv = ["--json", str(json_path)] if json_path else []
    if no_torch_compile:
        argv.append("--no-torch-compile")
    kernel_bench.main(argv)
