"""`trtfuse compile`, `trtfuse run` and `trtfuse compare`.

Exit statuses: 0 success; 1 `compare` found outputs beyond tolerance, or `run --leak-check` found a leak; 2 bad input
(the group's TrtfuseError handling); 3 TensorRT or a GPU is missing, so no engine was built or run (`compile` has still
fused and written the fused model and report).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from trtfuse.cli.check_report import CheckRequest, check_options, echo_result
from trtfuse.cli.options import (
    EXIT_MISMATCH,
    EXIT_MISSING_DEPENDENCY,
    FORCE_OPTION,
    HELP_OPTIONS,
    MAX_POSITIONS,
    FilePath,
    IntegerType,
    RangeType,
    ShapeRangeType,
    SizeType,
    common_options,
    detail,
    echo_json,
    exit_missing,
    feed_options,
    fusion_details,
    fusion_options,
    info,
    named_option,
    printable,
    summary,
    warning,
)
from trtfuse.contract import QUANTIZED_OPS, PluginKind
from trtfuse.engine.sidecar import layer_information_path
from trtfuse.errors import MissingDependencyError
from trtfuse.files import OutputPlan, Transaction, write_json_atomic

if TYPE_CHECKING:
    from trtfuse.engine.build import BuildResult
    from trtfuse.engine.profiles import DimRange, ShapeRange
    from trtfuse.fusion.options import FusionOptions
    from trtfuse.generate.agreement import GenerationRequest, GenerationVerdict
    from trtfuse.model.onnx_file import LoadedModel
    from trtfuse.pipeline import CompiledModel, FusedFile

PLUGIN_KINDS = tuple(kind.value for kind in PluginKind)
QUANTIZED_OP_NAMES = frozenset(op.name for op in QUANTIZED_OPS.values())
COMPARE_INSTALL_HINT = (
    "install it with `pip install -e '.[compare]'` in a trtfuse checkout, or `pip install polygraphy`"
)


@click.command("compile", context_settings=HELP_OPTIONS)
@click.argument("model_path", metavar="MODEL.onnx", type=FilePath())
@click.option("-o", "--output", "engine_path", type=FilePath(), help="Engine [default: MODEL.engine].")
@click.option(
    "--profile",
    "presets",
    multiple=True,
    type=click.Choice(["default", "decode", "prefill"]),
    help="A preset profile; repeat for several (e.g. --profile decode --profile prefill).",
)
@click.option(
    "--tokens", multiple=True, type=RangeType(minimum=1), help="One profile with this token range; repeatable."
)
@click.option("--batch", type=RangeType(minimum=1), help="Batch range of every profile [default: 1:2:2].")
@click.option("--past", type=RangeType(), help="Past (KV cache) length range [default: 0:256:4096].")
@named_option(
    "--shape",
    "shapes",
    ShapeRangeType(),
    "input",
    "Whole input shapes, e.g. input_ids=1x1:1x64:1x512 or input_ids:[1,1]:[1,64]:[1,512].",
)
@click.option(
    "--opt-level", default=3, show_default=True, type=IntegerType(0, 5), help="TensorRT builder optimisation level."
)
@click.option("--workspace", type=SizeType(), help="Workspace memory limit, e.g. 4G [default: TensorRT's].")
@click.option(
    "--timing-cache",
    type=FilePath(),
    help="Timing cache file, read if present (for AOT plugins, only if this trtfuse wrote it: FILE.trtfuse.json "
    "says which did), then updated.",
)
@click.option("--tf32", is_flag=True, help="Let TensorRT use TF32 for fp32 matmuls (faster, fp16-level error).")
@click.option(
    "--plugins",
    type=click.Choice(PLUGIN_KINDS),
    help="aot: TensorRT embeds the kernels and launches them itself, so the engine runs without Python "
    "(TensorRT >= 10.14); python: IPluginV3 plugins that call back into a Python process with trtfuse "
    "(TensorRT >= 10.8). [default: aot with TensorRT >= 10.14, else python]",
)
@click.option(
    "--baseline",
    is_flag=True,
    help="Also build the engine TensorRT makes from MODEL.onnx alone (same profiles, optimisation level, flags and "
    "timing cache), time both on this GPU (each profile at its OPT shapes; decode steps at the decode profile's "
    "MIN and MAX past too) and print the table; both engines' per-layer profiles go beside the engine "
    '(docs/engine.md, "Is it faster?").',
)
@click.option(
    "--never-slower",
    is_flag=True,
    help="With the A/B of --baseline (implied): where the trtfuse engine loses a case beyond noise, build and time "
    "the fusion with each kind of node left to TensorRT (--no-fuse-norm, --no-fuse-residual, --no-fuse-qk, "
    "--no-fuse-rope, --no-fuse-quant; at most one build per kind the model has, plus one combination) and keep the "
    "fastest configuration slower in no case; TensorRT alone's engine if none is.",
)
@click.option(
    "--strict-folds",
    is_flag=True,
    help="Exit 1 (the engine still written) when a quantized trtfuse node's output reaches a GEMM through a "
    "dequantize or reformat TensorRT left standing, or when the engine's layer information cannot show it; without "
    'it, a warning names them (docs/engine.md, "How the engine runs").',
)
@click.option(
    "--ab-rounds",
    default=15,
    show_default=True,
    type=IntegerType(minimum=6, maximum=1000),
    help="Paired timing rounds per case of the A/B (at least 6, for a 95 % interval).",
)
@FORCE_OPTION
@MAX_POSITIONS
@fusion_options
@common_options
def compile_command(
    model_path: Path,
    engine_path: Path | None,
    presets: tuple[str, ...],
    tokens: tuple[DimRange, ...],
    batch: DimRange | None,
    past: DimRange | None,
    shapes: dict[str, ShapeRange],
    opt_level: int,
    workspace: int | None,
    timing_cache: Path | None,
    tf32: bool,
    plugins: str | None,
    baseline: bool,
    never_slower: bool,
    strict_folds: bool,
    ab_rounds: int,
    force: bool,
    positions: int | None,
    fusion: FusionOptions,
    as_json: bool,
) -> None:
    """Fuse MODEL.onnx (as `trtfuse fuse` does), write the fused model and its report beside the engine, then build
    the TensorRT engine; with --baseline, also time it against the engine TensorRT builds from MODEL.onnx alone."""
    from trtfuse.engine.ab import TimingSettings
    from trtfuse.engine.baseline import BaselineRequest
    from trtfuse.engine.profiles import request_from_options
    from trtfuse.pipeline import compile_model

    engine_path = engine_path or model_path.with_suffix(".engine")
    request = request_from_options(
        presets=presets, tokens=tokens, batch=batch, past=past, shapes=shapes, positions=positions
    )
    compiled = compile_model(
        model_path,
        engine_path,
        request,
        optimization_level=opt_level,
        workspace_bytes=workspace,
        timing_cache=timing_cache,
        allow_tf32=tf32,
        plugins=None if plugins is None else PluginKind(plugins),
        fusion=fusion,
        baseline=(
            BaselineRequest(TimingSettings(rounds=ab_rounds), never_slower=never_slower)
            if baseline or never_slower
            else None
        ),
        notify=info,
        on_fused=lambda fused: _report_fused(fused, as_json),
        warn=warning,
        force=force,
    )
    if compiled.missing is not None:
        done = f"fused, but no engine built ({engine_path})"
        if as_json:
            echo_json({**compiled.to_json(), "error": f"{done}: {compiled.missing}", "exit": EXIT_MISSING_DEPENDENCY})
        exit_missing(compiled.missing, done, as_json=False)
    if as_json:
        echo_json(compiled.to_json())
    built = compiled.engine
    kind = built.plugin_kind.value
    folds_failed = _report_layers(built, strict_folds)
    if compiled.baseline is not None:
        _report_baseline(compiled, as_json)
    summary(
        f"built {built.engine_path} ({kind} plugins) in {built.seconds:.1f} s (sidecar {built.sidecar_path})", as_json
    )
    if folds_failed:
        raise SystemExit(EXIT_MISMATCH)


def _report_layers(built: BuildResult, strict_folds: bool) -> bool:
    """What the engine's layer information says of the trtfuse nodes: each node's layers with -v, the fold verdict
    (a warning where a dequantize was not folded); whether --strict-folds fails the call."""
    report = built.engine_report
    quantized = any(plugin["name"] in QUANTIZED_OP_NAMES for plugin in built.sidecar["plugins"])
    if report is None:
        if strict_folds and quantized:
            warning("--strict-folds: the engine's layer information could not be read, so no fold is shown")
            return True
        return False
    for line in report.lines():
        detail(line)
    if report.passed:
        info(report.verdict_line())
        return False
    warning(f"{report.verdict_line()} (layers: {layer_information_path(built.engine_path)})")
    return strict_folds


def _report_baseline(compiled: CompiledModel, as_json: bool) -> None:
    """The A/B table, then what --never-slower kept and why; with -q or --json, nothing (the JSON holds it)."""
    ab = compiled.baseline
    for line in ab.report.lines():
        summary(line, as_json)
    if ab.choice is not None:
        summary(f"--never-slower kept {ab.choice.kept.label()}: {ab.choice.why}", as_json)


def _report_fused(fused: FusedFile, as_json: bool) -> None:
    fusion_details(fused.report, fused.seconds)
    summary(_fused_line(fused), as_json)


def _fused_line(fused: FusedFile) -> str:
    return f"{fused.input_path}: {fused.counts.line()} -> {fused.output_path} (report {fused.report_path})"


@click.command("run", context_settings=HELP_OPTIONS)
@click.argument("engine_path", metavar="MODEL.engine", type=FilePath())
@click.option("--inputs", "inputs_path", type=FilePath(), help="Inputs as .npz (else random ones).")
@feed_options
@click.option("--iterations", default=10, show_default=True, type=IntegerType(minimum=1), help="Timed runs.")
@click.option("--warmup", default=2, show_default=True, type=IntegerType(minimum=0), help="Untimed runs first.")
@click.option("--save-outputs", type=FilePath(), help="Write the outputs of the last run as .npz.")
@click.option(
    "--leak-check",
    "leak_changes",
    metavar="N",
    type=IntegerType(minimum=1),
    help="Instead of timing: GPU memory in use before TensorRT and after N token-count changes in one execution "
    "context, all torn down (NVIDIA/TensorRT#4849, AOT plugins); exit 1 if it leaked. Takes only --seed.",
)
@FORCE_OPTION
@common_options
def run_command(
    engine_path: Path,
    inputs_path: Path | None,
    seed: int,
    shapes: dict[str, tuple[int, ...]],
    dims: dict[str, int],
    iterations: int,
    warmup: int,
    save_outputs: Path | None,
    leak_changes: int | None,
    force: bool,
    as_json: bool,
) -> None:
    """Run MODEL.engine with TensorRT (a Python-plugin engine's plugins registered first; an AOT engine needs none) on
    given or generated inputs; print timings. With --leak-check N, check it for a GPU memory leak instead."""
    if inputs_path is not None and (shapes or dims):
        raise click.UsageError("--inputs gives every input already; drop --shape/--dim")
    if leak_changes is not None:
        _leak_check(engine_path, leak_changes, seed, as_json)
        return
    from trtfuse.engine.run import run_engine_file

    try:
        run = run_engine_file(
            engine_path,
            inputs_path,
            seed,
            shapes,
            dims,
            iterations=iterations,
            warmup=warmup,
            save_outputs=save_outputs,
            force=force,
        )
    except MissingDependencyError as error:
        exit_missing(error, f"cannot run {engine_path}", as_json)
    if as_json:
        echo_json(run.to_json())
        return
    for line in run.lines():
        click.echo(printable(line))


# What `run` does besides the leak check; the check sets the token counts and runs a schedule of its own.
_NOT_WITH_LEAK_CHECK = ("inputs_path", "shapes", "dims", "iterations", "warmup", "save_outputs")


def _leak_check(engine_path: Path, changes: int, seed: int, as_json: bool) -> None:
    from trtfuse.engine.leak_check import leak_check_engine_file

    ctx = click.get_current_context()
    given = [
        next(opt for opt in param.opts if opt.startswith("--"))
        for param in ctx.command.params
        if param.name in _NOT_WITH_LEAK_CHECK
        and ctx.get_parameter_source(param.name) is not click.core.ParameterSource.DEFAULT
    ]
    if given:
        raise click.UsageError(f"--leak-check sets the inputs and runs itself; drop {'/'.join(given)}")
    try:
        report = leak_check_engine_file(engine_path, changes, seed)
    except MissingDependencyError as error:
        exit_missing(error, f"cannot check {engine_path} for a leak", as_json)
    if as_json:
        echo_json(report.to_json())
    else:
        for line in report.lines():
            click.echo(printable(line))
    if report.leaked:
        raise SystemExit(EXIT_MISMATCH)


@click.command("compare", context_settings=HELP_OPTIONS)
@click.argument("original_path", metavar="ORIGINAL.onnx", type=FilePath())
@click.argument("candidate_path", metavar="MODEL.engine|FUSED.onnx", type=FilePath())
@check_options
@click.option("--report", "report_path", type=FilePath(), help="Write the comparison as JSON.")
@FORCE_OPTION
@common_options
def compare_command(
    original_path: Path,
    candidate_path: Path,
    request: CheckRequest,
    report_path: Path | None,
    force: bool,
    as_json: bool,
) -> None:
    """Judge the engine MODEL.engine (or FUSED.onnx, run exactly as `trtfuse check` runs it) against onnxruntime on
    ORIGINAL.onnx with `check`'s steps and verdict; exit 1 if an output fails. With --generate N, also generate N
    tokens greedily on both from one prompt, as `check --generate` does."""
    from trtfuse.engine.compare import is_comparison_report
    from trtfuse.model.feed_files import is_trtfuse_archive
    from trtfuse.model.onnx_file import load_model

    plan = OutputPlan(force).read(original_path, candidate_path, *request.reads)
    plan.write("comparison report", report_path, ours=is_comparison_report)
    # The paths now; `compare` checks what the outputs would replace once it knows every file the models read.
    plan.write("saved inputs", request.save_inputs, ours=is_trtfuse_archive).check_paths()
    original = load_model(original_path)
    inputs = request.inputs(original)
    _check_engine_generation(original, candidate_path, request.generation)
    # Bad input is refused (exit 2) before a missing dependency is (exit 3): the user's first fix is their own.
    try:
        import polygraphy  # noqa: F401
    except ImportError:
        raise MissingDependencyError(f"`trtfuse compare` needs Polygraphy; {COMPARE_INSTALL_HINT}") from None
    from trtfuse.engine.compare import ORIGINAL_RUNNER, compare

    try:
        report = compare(
            original_path,
            candidate_path,
            inputs,
            loaded_original=original,
            plan=OutputPlan(force)
            .read(*request.reads)
            .write("comparison report", report_path, ours=is_comparison_report),
            notify=info,
        )
        generation = None if request.generation is None else _generation(original, candidate_path, request.generation)
    except MissingDependencyError as error:
        exit_missing(error, f"cannot compare against {candidate_path}", as_json)
    report_json = report.to_json()
    if generation is not None:
        report_json.update(passed=report.passed and generation.passed, generation=generation.to_json())
    if report_path is not None:
        with Transaction():
            write_json_atomic(report_path, report_json)
    # The tables' header: -q drops it with them.
    summary(f"{ORIGINAL_RUNNER} vs {report.candidate_runner}", as_json)
    echo_result(report.result, as_json, extra_json=report.to_json(), generation=generation)


def _check_engine_generation(original: LoadedModel, candidate_path: Path, request: GenerationRequest | None) -> None:
    """`compare --generate` on an engine: its profiles hold every step, checked as `generate` checks them, before
    the steps need TensorRT (a step they do not hold is bad input, exit 2, not a missing TensorRT)."""
    from trtfuse.engine.engine_file import is_onnx_model_path
    from trtfuse.generate.agreement import check_engine_generation

    if request is not None and not is_onnx_model_path(candidate_path):
        check_engine_generation(original, candidate_path, request)


def _generation(original: LoadedModel, candidate_path: Path, request: GenerationRequest) -> GenerationVerdict:
    """`compare --generate`: against the engine in TensorRT, or the fused model lowered on the CPU as `check`."""
    from trtfuse.engine.engine_file import is_onnx_model_path
    from trtfuse.generate.agreement import check_generation, compare_generation
    from trtfuse.model.onnx_file import load_model

    if is_onnx_model_path(candidate_path):
        return check_generation(original, load_model(candidate_path), request, notify=info)
    return compare_generation(original, candidate_path, request, notify=info)
