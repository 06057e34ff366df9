"""`trtfuse explain`: how an engine runs a fused model's trtfuse nodes, from the files trtexec writes; the analysis is
`trtfuse.engine.engine_report`'s."""

from __future__ import annotations

from pathlib import Path

import click

from trtfuse.cli.options import (
    EXIT_MISMATCH,
    HELP_OPTIONS,
    VERBOSITY,
    FilePath,
    IntegerType,
    common_options,
    echo_json,
    printable,
    warning,
)


@click.command("explain", context_settings=HELP_OPTIONS)
@click.argument("layers_path", metavar="LAYERS.json", type=FilePath())
@click.argument("fused_path", metavar="FUSED.onnx", type=FilePath())
@click.argument("profile_path", metavar="[PROFILE.json]", type=FilePath(), required=False)
@click.option(
    "--engine-profile",
    type=IntegerType(minimum=0),
    help="Read the layers of this optimisation profile [default: the one PROFILE.json times, else 0].",
)
@common_options
def explain_command(
    layers_path: Path, fused_path: Path, profile_path: Path | None, engine_profile: int | None, as_json: bool
) -> None:
    """Say how a TensorRT engine runs the trtfuse nodes of FUSED.onnx, from its layer information LAYERS.json: what
    `trtexec --profilingVerbosity=detailed --exportLayerInfo=LAYERS.json` writes (and, optionally, the per-layer
    timing PROFILE.json of `--exportProfile=PROFILE.json`). Per node: its layer and tactic, the reformat and standing
    quantize / dequantize layers next to it, and whether each DequantizeLinear after a quantized node was folded into
    an FP8 / INT8 GEMM; with a profile, the times. Exit 1 when a quantized node's output reaches a GEMM through a
    dequantize or reformat left standing (each such node named), 0 when every one was folded."""
    from trtfuse.engine.engine_report import analyse
    from trtfuse.engine.layer_info import read_layer_information
    from trtfuse.engine.layer_profile import read_profile
    from trtfuse.model.onnx_file import load_model

    info = read_layer_information(layers_path)
    profile = read_profile(profile_path) if profile_path is not None else None
    report = analyse(info, load_model(fused_path), profile, engine_profile)
    if report.not_found:
        shown = ", ".join(f"'{name}'" for name in report.not_found[:3])
        more = f" and {len(report.not_found) - 3} more" if len(report.not_found) > 3 else ""
        warning(f"{layers_path}: no layer names trtfuse node {shown}{more}; its verdicts are unknown")
    if as_json:
        echo_json(report.to_json())
    else:
        if VERBOSITY.level >= 0:
            for line in report.lines():
                click.echo(printable(line))
        click.secho(printable(report.verdict_line()), fg=None if report.passed else "red")
    if not report.passed:
        raise SystemExit(EXIT_MISMATCH)
