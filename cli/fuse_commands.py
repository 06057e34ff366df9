"""`trtfuse inspect`, `trtfuse fuse` and `trtfuse check`.

Each command imports the pipeline modules when it runs, so `trtfuse --help` and the other commands do not pay for
onnx-graphsurgeon and onnxruntime imports they do not use.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import click

from cli.options import echo_output_errors, feed_options
from trtfuse import contract
from trtfuse.errors import TrtfuseError

if TYPE_CHECKING:
    from trtfuse.patterns import NormSearch, RmsNormMatch


def _match_line(match: RmsNormMatch) -> str:
    return (
        f"{match.name}  eps={match.epsilon:g} hidden={match.hidden_size} {match.dtype} "
        f"weight={match.weight_mode.name} offset={match.weight_offset:g} tags={','.join(match.tags)}"
    )


def _match_json(match: RmsNormMatch) -> dict:
    return {
        "name": match.name,
        "epsilon": match.epsilon,
        "hidden_size": match.hidden_size,
        "dtype": match.dtype,
        "weight_mode": match.weight_mode.name,
        "weight_offset": match.weight_offset,
        "tags": list(match.tags),
        "replaces": [node.name for node in match.nodes],
    }


def _search_json(search: NormSearch) -> dict:
    return {
        "rms_norms": [_match_json(match) for match in search.matches],
        "qk_norm_pairs": [{"q": _match_json(pair.q), "k": _match_json(pair.k)} for pair in search.qk_norm_pairs],
        "near_misses": [{"node": miss.node, "reason": miss.reason} for miss in search.near_misses],
    }


@click.command()
@click.argument("model_path", metavar="MODEL.onnx", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the candidates as JSON.")
def inspect(model_path: Path, as_json: bool) -> None:
    """List every norm candidate of MODEL.onnx: what it matched as, or why it was rejected."""
    from trtfuse.fuse import search_model
    from trtfuse.io import load_model

    search = search_model(load_model(model_path).model)
    if as_json:
        click.echo(json.dumps(_search_json(search), indent=2))
        return
    click.echo(
        f"{model_path}: {len(search.matches)} RMSNorm, {len(search.qk_norm_pairs)} QK-norm pairs, "
        f"{len(search.near_misses)} rejected"
    )
    for match in search.matches:
        click.echo(f"  rms_norm  {_match_line(match)}")
    for pair in search.qk_norm_pairs:
        click.echo(f"  qk_norm   q: {_match_line(pair.q)}")
        click.echo(f"            k: {_match_line(pair.k)}")
    for miss in search.near_misses:
        click.echo(f"  rejected  {miss.node}: {miss.reason}")


@click.command()
@click.argument("input_path", metavar="IN.onnx", type=click.Path(path_type=Path))
@click.option("-o", "--output", "output_path", required=True, type=click.Path(path_type=Path), help="Fused model.")
@click.option("--report", "report_path", type=click.Path(path_type=Path), help="Write the JSON fusion report here.")
def fuse(input_path: Path, output_path: Path, report_path: Path | None) -> None:
    """Rewrite every RMSNorm and QK-norm of IN.onnx into trtfuse plugin nodes and write OUT.onnx."""
    from trtfuse.fuse import fuse_model
    from trtfuse.io import check_output_path, load_model, save_model, write_text_atomic

    for path in (output_path, report_path):
        if path is not None:
            check_output_path(path)
    loaded = load_model(input_path)
    try:
        result = fuse_model(loaded.model)
    except TrtfuseError as error:
        raise TrtfuseError(f"{input_path}: {error}") from None
    save_model(result.model, output_path, source=loaded)
    report = result.report()
    if report_path is not None:
        write_text_atomic(report_path, json.dumps(report, indent=2) + "\n")
    totals = report["totals"]
    click.echo(
        f"{input_path}: {totals[contract.RMS_NORM_OP]} {contract.RMS_NORM_OP} and {totals[contract.QK_NORM_OP]} "
        f"{contract.QK_NORM_OP} nodes ({totals['norms']} norms), {len(report['near_misses'])} rejected -> {output_path}"
    )


@click.command()
@click.argument("original_path", metavar="ORIGINAL.onnx", type=click.Path(path_type=Path))
@click.argument("fused_path", metavar="FUSED.onnx", type=click.Path(path_type=Path))
@feed_options
def check(
    original_path: Path, fused_path: Path, seed: int, shapes: dict[str, tuple[int, ...]], dims: dict[str, int]
) -> None:
    """Run ORIGINAL.onnx and FUSED.onnx (plugin nodes lowered to standard ops) in onnxruntime on the same random
    inputs; print each output's max abs and max relative error and exit 1 beyond the dtype's tolerance."""
    from trtfuse.check import check_fused
    from trtfuse.io import load_model

    result = check_fused(load_model(original_path), load_model(fused_path), seed=seed, shapes=shapes, dims=dims)
    echo_output_errors(result.errors)
