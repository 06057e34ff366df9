"""`trtfuse inspect`, `trtfuse fuse` and `trtfuse check`.

Each command imports the pipeline modules when it runs, so `trtfuse --help` and the other commands do not pay for
onnx-graphsurgeon and onnxruntime imports they do not use.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from trtfuse.cli.check_report import CheckRequest, check_options, echo_result
from trtfuse.cli.options import (
    FORCE_OPTION,
    HELP_OPTIONS,
    FilePath,
    common_options,
    echo_json,
    fusion_details,
    fusion_options,
    info,
    printable,
    summary,
    warning,
)
from trtfuse.files import OutputPlan

if TYPE_CHECKING:
    from trtfuse.contract import NormParams, RotaryParams
    from trtfuse.fusion.options import FusionOptions
    from trtfuse.fusion.patterns import AddNormMatch, NormSearch, QkNormRopeMatch, RmsNormMatch, TakenQuantizer


def _match_line(match: RmsNormMatch) -> str:
    return _norm_line(match, match.dtype, match.params, match.tags) + _quant_text(match.quantizers)


def _add_norm_line(add: AddNormMatch) -> str:
    return f"{_norm_line(add.norm, add.dtype, add.params, add.tags)} add={add.add}{_quant_text(add.all_quantizers)}"


def _rotation_line(rotary: RotaryParams) -> str:
    moved = f" -> {rotary.output_layout.name.lower()}" if rotary.moves_heads else ""
    return (
        f"head_dim={rotary.head_dim} rotary_dim={rotary.rotary_dim} {rotary.rotation.name.lower()} "
        f"{rotary.layout.name.lower()}{moved}"
    )


def _quant_text(quantizers: tuple[TakenQuantizer, ...]) -> str:
    """` quant=input:int8@0.0125,output:float8_e4m3fn@0.05`: each stage's dtype and scale; nothing for a plain node."""
    if not quantizers:
        return ""
    stages = ",".join(f"{taken.stage.value}:{taken.quantizer.dtype}@{taken.quantizer.scale:g}" for taken in quantizers)
    return f" quant={stages}"


def _norm_line(match: RmsNormMatch, dtype: str, params: NormParams, tags: tuple[str, ...]) -> str:
    """A norm as inspect prints it, read in `dtype` with `params` (an add-norm's are those of the sum it reads)."""
    dtypes = dtype if match.output_dtype == dtype else f"{dtype}->{match.output_dtype}"
    return (
        f"{match.name}  eps={params.epsilon:g} hidden={match.hidden_size} {dtypes} "
        f"weight={params.weight_mode.name} offset={params.weight_offset:g} tags={','.join(tags)}"
    )


def _match_json(match: RmsNormMatch) -> dict:
    return _with_quant(_plain_match_json(match), match.quantizers)


def _with_quant(entry: dict, quantizers: tuple[TakenQuantizer, ...]) -> dict:
    from trtfuse.fusion.fuse import quantizers_json

    return {**entry, "quant": quantizers_json(quantizers)} if quantizers else entry


def _plain_match_json(match: RmsNormMatch) -> dict:
    return {
        "name": match.name,
        "epsilon": match.params.epsilon,
        "hidden_size": match.hidden_size,
        "dtype": match.dtype,
        "output_dtype": match.output_dtype,
        "weight_mode": match.params.weight_mode.name,
        "weight_offset": match.params.weight_offset,
        "tags": list(match.tags),
        "replaces": [node.name for node in match.nodes],
    }


def _add_norm_json(add: AddNormMatch) -> dict:
    entry = {
        **_plain_match_json(add.norm),
        "dtype": add.dtype,
        "weight_mode": add.params.weight_mode.name,
        "tags": list(add.tags),
        "add": add.add,
        "replaces": [node.name for node in [*add.nodes, *add.norm.nodes]],
    }
    return _with_quant(entry, add.all_quantizers)


def _rope_json(rope: QkNormRopeMatch) -> dict:
    from trtfuse.fusion.fuse import rotary_json

    sides = {
        role: {**_match_json(side.norm), "rotation": [node.name for node in side.nodes]}
        for role, side in (("q", rope.q), ("k", rope.k))
    }
    return _with_quant({**sides, "rotary": rotary_json(rope.q.rotary)}, rope.quantizers)


def _search_json(search: NormSearch) -> dict:
    from trtfuse.fusion.fuse import near_miss_json, quant_near_miss_json, rope_near_miss_json

    ropes = {"qk_norm_ropes": [_rope_json(rope) for rope in search.qk_norm_ropes]} if search.qk_norm_ropes else {}
    return {
        "rms_norms": [_match_json(match) for match in search.matches],
        "add_rms_norms": [_add_norm_json(add) for add in search.add_norms],
        "qk_norm_pairs": [{"q": _match_json(pair.q), "k": _match_json(pair.k)} for pair in search.qk_norm_pairs],
        **ropes,
        "near_misses": near_miss_json(search.near_misses),
        "residual_near_misses": near_miss_json(search.residual_near_misses),
        **quant_near_miss_json(search),
        **rope_near_miss_json(search),
    }


@click.command(context_settings=HELP_OPTIONS)
@click.argument("model_path", metavar="MODEL.onnx", type=FilePath())
@fusion_options
@common_options
def inspect(model_path: Path, fusion: FusionOptions, as_json: bool) -> None:
    """List every norm candidate of MODEL.onnx: what it matched as (with the residual Add it takes, for an add-norm),
    or why it was rejected, and each Add kept out of the norm after it. The first line counts the plugin nodes the
    fused model would hold, as `fuse` and `compile` say."""
    from trtfuse.fusion.fuse import fuse_model
    from trtfuse.model.onnx_file import load_model

    # The whole fusion, so that the counts are those of the model `fuse` writes (plugin nodes the input held count).
    result = fuse_model(load_model(model_path).model, fusion, model_path)
    search = result.search
    if as_json:
        echo_json({**_search_json(search), **result.counts().to_json()})
        return
    summary(f"{model_path}: {result.counts().line(reasons=0)}", as_json)
    lines = [f"  rms_norm  {_match_line(match)}" for match in search.matches]
    lines += [f"  add_norm  {_add_norm_line(add)}" for add in search.add_norms]
    for pair in search.qk_norm_pairs:
        lines += [f"  qk_norm   q: {_match_line(pair.q)}", f"            k: {_match_line(pair.k)}"]
    for rope in search.qk_norm_ropes:
        rotation = _rotation_line(rope.q.rotary) + _quant_text(rope.quantizers)
        lines += [f"  qk_rope   q: {_match_line(rope.q.norm)}", f"            k: {_match_line(rope.k.norm)}"]
        lines += [f"            rotation: {rotation}"]
    lines += [f"  rejected  {miss.node}: {miss.reason}" for miss in search.near_misses]
    lines += [f"  add kept  {miss.node}: {miss.reason}" for miss in search.residual_near_misses]
    lines += [f"  q kept    {miss.node}: {miss.reason}" for miss in search.quant_near_misses or ()]
    lines += [f"  rope kept {miss.node}: {miss.reason}" for miss in search.rope_near_misses or ()]
    for line in lines:
        click.echo(printable(line))


@click.command(context_settings=HELP_OPTIONS)
@click.argument("input_path", metavar="IN.onnx", type=FilePath())
@click.option("-o", "--output", "output_path", required=True, type=FilePath(), help="Fused model.")
@click.option("--report", "report_path", type=FilePath(), help="Write the JSON fusion report here.")
@FORCE_OPTION
@fusion_options
@common_options
def fuse(
    input_path: Path, output_path: Path, report_path: Path | None, force: bool, fusion: FusionOptions, as_json: bool
) -> None:
    """Rewrite every RMSNorm and QK-norm of IN.onnx (with the residual Add in front of it, unless --no-fuse-residual)
    into trtfuse plugin nodes and write OUT.onnx."""
    from trtfuse.pipeline import fuse_file

    fused = fuse_file(input_path, output_path, report_path, notify=info, fusion=fusion, force=force)
    fusion_details(fused.report, fused.seconds)
    if as_json:
        echo_json({"input": str(input_path), "output": str(output_path), **fused.report})
    summary(f"{input_path}: {fused.counts.line()} -> {output_path}", as_json)


@click.command(context_settings=HELP_OPTIONS)
@click.argument("original_path", metavar="ORIGINAL.onnx", type=FilePath())
@click.argument("fused_path", metavar="FUSED.onnx", type=FilePath())
@check_options
@FORCE_OPTION
@common_options
def check(original_path: Path, fused_path: Path, request: CheckRequest, force: bool, as_json: bool) -> None:
    """Run ORIGINAL.onnx twice and FUSED.onnx (plugin nodes lowered to standard ops) in onnxruntime on the same
    inputs, at a prefill and a decode step on KV-cache models; exit 1 if an output fails. Float32 graphs pass within
    the dtype's tolerance; 16-bit and quantized graphs when the fused model's error against a float32 evaluation of
    the original is no worse than the original's own (docs/cli.md). With --generate N, also generate N tokens
    greedily on both from one prompt; they must be the same, but for a divergence at a near tie or, in a quantized
    graph, one that quantizer flips explain."""
    from trtfuse.model.feed_files import is_trtfuse_archive
    from trtfuse.model.onnx_file import load_model
    from trtfuse.verify.check import check_fused
    from trtfuse.verify.interface import check_original_unfused, unfused_candidate_warning

    original, fused = load_model(original_path), load_model(fused_path)
    check_original_unfused(original)
    plan = OutputPlan(force).read(original_path, fused_path, *original.data_files, *fused.data_files)
    plan.read(*request.reads)
    plan.write("saved inputs", request.save_inputs, ours=is_trtfuse_archive).check()
    result = check_fused(original, fused, request.inputs(original), notify=info)
    generation = None
    if request.generation is not None:
        from trtfuse.generate.agreement import check_generation

        generation = check_generation(original, fused, request.generation, notify=info)
    # After the run, so that bad input stays one line; before the verdict, which it qualifies.
    unfused = unfused_candidate_warning(fused)
    if unfused:
        warning(unfused)
    echo_result(result, as_json, generation=generation)
