"""`trtfuse bench kernels`: the CuTeDSL kernel benchmark (trtfuse/bench/kernels.py) from the command line."""

from __future__ import annotations

from pathlib import Path

import click

from trtfuse.bench import SECTIONS
from trtfuse.cli.options import FORCE_OPTION, HELP_OPTIONS, FilePath, common_options, echo_json
from trtfuse.errors import MissingDependencyError
from trtfuse.files import OutputPlan, json_holding, write_json_atomic

_GROUP_JSON = "trtfuse.bench.json"
# A kernel benchmark report trtfuse wrote (trtfuse.bench.kernels.run's), which a later call may replace.
_is_benchmark_report = json_holding("gpu", "copy_gbs", "launch_floor_us")
# The gpu extra: the kernels extra alone has no torch, which the benchmark times against.
BENCH_INSTALL_HINT = (
    "install them with `pip install -e '.[gpu]'` in a trtfuse checkout, on a machine with an NVIDIA GPU"
)


@click.group("bench", context_settings=HELP_OPTIONS)
@common_options
@click.pass_context
def bench(ctx: click.Context, as_json: bool) -> None:
    """Benchmarks that need a GPU (-v, -q and --json here hold for the benchmark that follows)."""
    ctx.meta[_GROUP_JSON] = as_json


@bench.command("kernels", context_settings=HELP_OPTIONS)
@click.option("--report", "report_path", type=FilePath(), help="Also write the full results here.")
@click.option("--no-torch-compile", is_flag=True, help="Skip the torch.compile baselines (saves their compile time).")
@click.option(
    "--section",
    "sections",
    multiple=True,
    type=click.Choice(SECTIONS),
    help="Run this part only (repeatable; default: all). 'anchors' puts ours beside QuACK, Liger and torch.compile.",
)
@FORCE_OPTION
@common_options
@click.pass_context
def kernels(
    ctx: click.Context,
    report_path: Path | None,
    no_torch_compile: bool,
    sections: tuple[str, ...],
    force: bool,
    as_json: bool,
) -> None:
    """RMSNorm / QK-norm kernels against the copy ceiling, torch and torch.compile (docs/performance.md)."""
    as_json = as_json or ctx.meta.get(_GROUP_JSON, False)
    OutputPlan(force).write("benchmark report", report_path, ours=_is_benchmark_report).check()
    try:
        import torch

        from trtfuse.bench import kernels as kernel_bench
    except ImportError as error:
        raise MissingDependencyError(
            f"the kernel benchmark needs torch and nvidia-cutlass-dsl ({error}); {BENCH_INSTALL_HINT}"
        ) from error
    if not torch.cuda.is_available():
        raise MissingDependencyError("the kernel benchmark needs a CUDA GPU, and torch sees none")
    report = kernel_bench.run(compiled=not no_torch_compile, sections=sections or SECTIONS)
    if as_json:
        echo_json(report)
    else:
        kernel_bench.print_report(report)
    if report_path is not None:
        write_json_atomic(report_path, report)
