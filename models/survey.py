"""Run trtfuse on every export of the per-tool scripts as a new user would, and tabulate what happened.

For each file listed in `EXPORTS/<tool>/expected.json`: `trtfuse inspect --json`, `trtfuse fuse`, `trtfuse check
ORIGINAL FUSED` with no options, and `trtfuse compile` (which stops with exit 3 where TensorRT is absent); with
`--generate N` also `trtfuse check ORIGINAL FUSED --generate N` on each export with a KV cache. `--skip inspect --skip
compile` leaves the check columns alone (the near misses then come from fuse's report), and `--file GLOB` takes only
the exports whose file name matches. Writes OUT (a JSON list: everything, messages verbatim) and prints Markdown
tables (also into --markdown): one row per tool and family, one per export (fused / expected norms, QK pairs (q/k and
MLA latent norms) found / expected, rejected candidates, the check verdict, compile's exit status, the first message
of whatever went wrong, among them `inspect` and `fuse` counting other norms or near misses (else the first reason a
candidate, Add, Q or rotation was kept out); the norms fused with
their residual Add, TrtfuseAddRmsNorm, against the manifest's `add_norm_calls` where it has them, and the residual
Adds kept out of a norm fused alone; the QuantizeLinear nodes taken into quantized nodes, TrtfuseRmsNormQuant and
TrtfuseAddRmsNormQuant, and those kept out of a fused norm; the QK pairs fused with the rotary embedding after them,
TrtfuseQkNormRope, and the rotations kept out), and the combinations a tool failed.

\b
    python models/survey.py $EXPORTS --out $EXPORTS/survey.json --markdown $EXPORTS/survey.md --jobs 2
    python models/survey.py $EXPORTS --out /tmp/o.json --tool optimum --trtfuse "python3 -m trtfuse.cli.main"
    python models/survey.py $EXPORTS --out /tmp/c.json --tool modelopt --skip inspect --skip compile --generate 16
"""

from __future__ import annotations

import fnmatch
import json
import shlex
import subprocess
import tempfile
from collections import Counter
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from pathlib import Path

import click
import onnx

COMMAND_TIMEOUT_S = 900
VERDICTS = {0: "pass", 1: "FAIL (numerics)", 2: "error (exit 2)"}


def verdict(exit_status: int | None) -> str:
    if exit_status is None:
        return "not run"
    return VERDICTS.get(exit_status, f"exit {exit_status}")


@dataclass(frozen=True)
class Steps:
    """Which trtfuse commands run on each export besides fuse and check."""

    inspect: bool = True
    compile: bool = True
    # Tokens of `check --generate` on the exports with a KV cache; 0: not run.
    generate: int = 0


@dataclass
class Outcome:
    """What trtfuse did with one export."""

    tool: str
    file: str
    architecture: str
    expected_norms: int
    expected_qk_pairs: int
    # Norm module calls the tool moved into an attention op (genai's GroupQueryAttention): nothing left to fuse.
    absorbed: int = 0
    # A KV cache (has_kv_cache): `--generate` runs on it.
    kv_cache: bool = False
    fused_norms: int | None = None
    rms_norm_nodes: int | None = None
    qk_norm_nodes: int | None = None
    add_norm_nodes: int | None = None
    # The norm calls that read a residual sum, where the manifest says (exports made before the add-norm do not).
    expected_add_norms: int | None = None
    # Fused nodes without a weight in a family whose every norm has one: the weight multiply was left in the graph.
    weightless_nodes: int | None = None
    rejected: list[dict[str, str]] = field(default_factory=list)
    # Residual Adds kept out of the norm after them (the norm fused alone): no rejected norm.
    kept_out: list[dict[str, str]] = field(default_factory=list)
    # QuantizeLinear nodes the fused nodes took in, and those left outside a fused norm (with the reason).
    quantizers_taken: int | None = None
    quant_kept_out: list[dict[str, str]] = field(default_factory=list)
    # QK pairs fused with their rotary embedding (TrtfuseQkNormRope, among the QK pairs), and the rotations kept out.
    rope_nodes: int | None = None
    rope_kept_out: list[dict[str, str]] = field(default_factory=list)
    # What `inspect` found (norms in matches and pairs): `fuse` must report the same norms and near misses.
    inspected_norms: int | None = None
    inspect_exit: int | None = None
    fuse_exit: int | None = None
    check_exit: int | None = None
    compile_exit: int | None = None
    generate_exit: int | None = None
    check_output: str = ""
    generate_output: str = ""
    messages: list[str] = field(default_factory=list)

    @property
    def verdict(self) -> str:
        return verdict(self.check_exit)

    @property
    def generate_verdict(self) -> str:
        """`check --generate`'s verdict; "-" for an export without a KV cache, which it does not run on."""
        return verdict(self.generate_exit) if self.kv_cache else "-"


def run(trtfuse: list[str], args: list[str], cwd: Path | None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*trtfuse, *args], capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, cwd=cwd)


def last_lines(result: subprocess.CompletedProcess[str], count: int = 1) -> str:
    lines = [line for line in (result.stderr + result.stdout).splitlines() if line.strip()]
    return " | ".join(lines[-count:])


def failure_line(output: str, result: subprocess.CompletedProcess[str]) -> str:
    """The first line of `check`'s output that says what failed: a FAIL row or a generation's divergence."""
    failed = [
        " ".join(line.split()) for line in output.splitlines() if " FAIL" in line or "generation: diverged" in line
    ]
    return failed[0] if failed else last_lines(result)


def projection_norm_calls(entry: dict) -> int:
    """The norm calls that pair into TrtfuseQkNorm (or TrtfuseQkNormRope) nodes: q/k norms (less those inside an
    attention op) and MLA latent norms (DeepSeek's q_a/kv_a, counted apart; manifests written before they were have
    none)."""
    return int(entry["qk_norm_calls"]) + int(entry.get("mla_norm_calls", 0)) - int(entry.get("absorbed_norm_calls", 0))


def has_kv_cache(path: Path, entry: dict) -> bool:
    """The manifest's `cache` entry (export.py's and ModelOpt's `--cache`), else a `past_key_values.*` graph input:
    optimum's and genai's manifests record none, nor do onnxslim's copies of optimum's exports."""
    if "cache" in entry:
        return True
    graph = onnx.load(str(path), load_external_data=False).graph
    return any(value.name.startswith("past_key_values.") for value in graph.input)


def survey_one(
    trtfuse: list[str], cwd: Path | None, steps: Steps, tool: str, path: Path, entry: dict, scratch: Path
) -> Outcome:
    outcome = Outcome(
        tool=tool,
        file=path.name,
        architecture=str(entry["architecture"]),
        expected_norms=int(entry["norm_calls"]) - int(entry.get("absorbed_norm_calls", 0)),
        expected_qk_pairs=projection_norm_calls(entry) // 2,
        absorbed=int(entry.get("absorbed_norm_calls", 0)),
        expected_add_norms=entry.get("add_norm_calls"),
        kv_cache=has_kv_cache(path, entry),
    )
    if steps.inspect:
        record_inspect(trtfuse, cwd, path, outcome)
    fused = scratch / f"{path.stem}.fused.onnx"
    report = scratch / f"{path.stem}.report.json"
    fusing = run(trtfuse, ["fuse", str(path), "-o", str(fused), "--report", str(report)], cwd)
    outcome.fuse_exit = fusing.returncode
    if fusing.returncode != 0:
        outcome.messages.append(f"fuse: {last_lines(fusing)}")
        return outcome
    count_fused(json.loads(report.read_text()), entry, outcome)
    checking = run(trtfuse, ["check", str(path), str(fused)], cwd)
    outcome.check_exit = checking.returncode
    outcome.check_output = (checking.stdout + checking.stderr).strip()
    if checking.returncode != 0:
        outcome.messages.append(f"check: {failure_line(outcome.check_output, checking)}")
    if steps.generate and outcome.kv_cache:
        generating = run(trtfuse, ["check", str(path), str(fused), "--generate", str(steps.generate)], cwd)
        outcome.generate_exit = generating.returncode
        # stdout only: stderr holds a progress line per generated token.
        outcome.generate_output = generating.stdout.strip()
        if generating.returncode != 0:
            outcome.messages.append(f"check --generate: {failure_line(outcome.generate_output, generating)}")
    if steps.compile:
        compiling = run(trtfuse, ["compile", str(path), "-o", str(scratch / f"{path.stem}.engine")], cwd)
        outcome.compile_exit = compiling.returncode
        if compiling.returncode not in (0, 3):
            outcome.messages.append(f"compile: {last_lines(compiling)}")
    return outcome


def record_inspect(trtfuse: list[str], cwd: Path | None, path: Path, outcome: Outcome) -> None:
    """`inspect --json`'s norms and near misses into `outcome`, which fuse's report must then agree with."""
    inspected = run(trtfuse, ["inspect", str(path), "--json"], cwd)
    outcome.inspect_exit = inspected.returncode
    if inspected.returncode == 0:
        found = json.loads(inspected.stdout)
        outcome.rejected = found.get("near_misses", [])
        outcome.kept_out = found.get("residual_near_misses", [])
        outcome.quant_kept_out = found.get("quant_near_misses", [])
        outcome.rope_kept_out = found.get("rope_near_misses", [])
        outcome.inspected_norms = (
            len(found.get("rms_norms", []))
            + 2 * len(found.get("qk_norm_pairs", []))
            + 2 * len(found.get("qk_norm_ropes", []))
            + len(found.get("add_rms_norms", []))
        )
    else:
        outcome.messages.append(f"inspect: {last_lines(inspected)}")


def count_fused(fusion: dict, entry: dict, outcome: Outcome) -> None:
    """The fuse report's counts into `outcome`; its near misses too where inspect did not run."""
    totals = fusion["totals"]
    if entry["uses_rms_norm"]:
        outcome.weightless_nodes = sum(node["weight_mode"] == "NONE" for node in fusion["fused"])
    outcome.fused_norms = totals.get("norms", 0)

    # A quantized node (the plain op's name + "Quant") is its plain op's norm with the Q/DQ pairs taken in: counted
    # with it.
    def nodes_of(op: str) -> int:
        return totals.get(op, 0) + totals.get(f"{op}Quant", 0)

    outcome.rms_norm_nodes = nodes_of("TrtfuseRmsNorm")
    outcome.rope_nodes = nodes_of("TrtfuseQkNormRope")
    outcome.qk_norm_nodes = nodes_of("TrtfuseQkNorm") + outcome.rope_nodes
    outcome.add_norm_nodes = nodes_of("TrtfuseAddRmsNorm")
    outcome.quantizers_taken = fusion.get("quantizers_taken", 0)
    kept_out = fusion.get("residual_near_misses", [])
    quant_kept_out = fusion.get("quant_near_misses", [])
    rope_kept_out = fusion.get("rope_near_misses", [])
    if outcome.inspect_exit is None:
        outcome.rejected, outcome.kept_out, outcome.quant_kept_out = fusion["near_misses"], kept_out, quant_kept_out
        outcome.rope_kept_out = rope_kept_out
    if outcome.inspected_norms is not None and (
        outcome.inspected_norms != outcome.fused_norms
        or len(outcome.rejected) != len(fusion["near_misses"])
        or len(outcome.kept_out) != len(kept_out)
        or len(outcome.quant_kept_out) != len(quant_kept_out)
        or len(outcome.rope_kept_out) != len(rope_kept_out)
    ):
        outcome.messages.append(
            f"inspect/fuse disagree: inspect {outcome.inspected_norms} norms, {len(outcome.rejected)} rejected, "
            f"{len(outcome.kept_out)} Adds and {len(outcome.quant_kept_out)} Qs kept out; fuse {outcome.fused_norms} "
            f"norms, {len(fusion['near_misses'])} rejected, {len(kept_out)} Adds and {len(quant_kept_out)} Qs kept out"
        )


def fused_text(outcome: Outcome) -> str:
    fused = "-" if outcome.fused_norms is None else str(outcome.fused_norms)
    if outcome.absorbed:
        fused += f" (+{outcome.absorbed} inside attention)"
    if outcome.weightless_nodes:
        fused += f" ({outcome.weightless_nodes} without weight)"
    return f"{fused} / {outcome.expected_norms}"


def add_norm_text(outcome: Outcome) -> str:
    """Add-norm nodes (quantized or not), against the expected count where the manifest has one."""
    fused = "-" if outcome.add_norm_nodes is None else str(outcome.add_norm_nodes)
    if outcome.expected_add_norms is not None:
        fused += f" / {outcome.expected_add_norms}"
    return fused


def quant_text(outcome: Outcome) -> str:
    """The QuantizeLinear nodes taken into fused nodes, and those kept out of a fused norm."""
    taken = "-" if outcome.quantizers_taken is None else str(outcome.quantizers_taken)
    return taken + (f" ({len(outcome.quant_kept_out)} kept out)" if outcome.quant_kept_out else "")


def rope_text(outcome: Outcome) -> str:
    """The QK pairs fused with their rotary embedding, and the rotations kept out."""
    fused = "-" if outcome.rope_nodes is None else str(outcome.rope_nodes)
    return fused + (f" ({len(outcome.rope_kept_out)} kept out)" if outcome.rope_kept_out else "")


def table(outcomes: list[Outcome], generate: int = 0) -> str:
    """One row per export; a `generate N` column after check's where `--generate N` ran."""
    generating = f" generate {generate} |" if generate else ""
    rows = [
        "| tool | export | fused / expected | QK pairs / expected | with rotation | add-norms | Adds kept out "
        f"| Qs taken in | rejected | check |{generating} compile | what went wrong |",
        "|---|---|---|---|---|---|---|---|---|---|" + "---|" * bool(generate) + "---|---|",
    ]
    for outcome in outcomes:
        fused = fused_text(outcome)
        pairs = "-" if outcome.qk_norm_nodes is None else str(outcome.qk_norm_nodes)
        wrong = "; ".join(outcome.messages) or "; ".join(
            r["reason"]
            for r in [*outcome.rejected, *outcome.kept_out, *outcome.quant_kept_out, *outcome.rope_kept_out][:1]
        )
        rows.append(
            f"| {outcome.tool} | {outcome.file} | {fused} | "
            f"{pairs} / {outcome.expected_qk_pairs} | {rope_text(outcome)} | {add_norm_text(outcome)} | "
            f"{len(outcome.kept_out)} | "
            f"{quant_text(outcome)} | {len(outcome.rejected)} | {outcome.verdict} | "
            + (f"{outcome.generate_verdict} | " if generate else "")
            + f"{'-' if outcome.compile_exit is None else outcome.compile_exit} | "
            f"{wrong.replace('|', '/')[:300]} |"
        )
    return "\n".join(rows)


def summary(outcomes: list[Outcome], generate: int = 0) -> str:
    """One row per tool and family: its exports, and the distinct fused / QK-pair counts and verdicts among them (and
    `check --generate N`'s over the KV-cache exports where it ran)."""
    groups: dict[tuple[str, str], list[Outcome]] = {}
    for outcome in outcomes:
        groups.setdefault((outcome.tool, outcome.architecture), []).append(outcome)
    rows = [
        "| tool | family | exports | fused / expected | QK pairs / expected | with rotation | add-norms "
        "| Adds kept out | Qs taken in | check |" + (f" generate {generate} |" if generate else ""),
        "|---|---|---|---|---|---|---|---|---|---|" + "---|" * bool(generate),
    ]
    for (tool, architecture), group in groups.items():
        fused = {fused_text(outcome) for outcome in group}
        pairs = {f"{outcome.qk_norm_nodes} / {outcome.expected_qk_pairs}" for outcome in group}
        ropes = {rope_text(outcome) for outcome in group}
        add_norms = {add_norm_text(outcome) for outcome in group}
        kept_out = {str(len(outcome.kept_out)) for outcome in group}
        quantizers = {quant_text(outcome) for outcome in group}
        verdicts = Counter(outcome.verdict for outcome in group)
        generations = Counter(outcome.generate_verdict for outcome in group if outcome.kv_cache)
        rows.append(
            f"| {tool} | {architecture} | {', '.join(sorted(_form(outcome) for outcome in group))} | "
            f"{'; '.join(sorted(fused))} | {'; '.join(sorted(pairs))} | {'; '.join(sorted(ropes))} | "
            f"{'; '.join(sorted(add_norms))} | "
            f"{'; '.join(sorted(kept_out))} | {'; '.join(sorted(quantizers))} | "
            f"{counts_text(verdicts)} |" + (f" {counts_text(generations) or '-'} |" if generate else "")
        )
    return "\n".join(rows)


def counts_text(verdicts: Counter[str]) -> str:
    return ", ".join(f"{count} {verdict}" for verdict, count in verdicts.items())


def _form(outcome: Outcome) -> str:
    """The file name without its family and tool: "fp16-O2", "cpu-int4", "optimum-fp16-slim"."""
    return Path(outcome.file).stem.removeprefix(f"{outcome.architecture}-").removeprefix(f"{outcome.tool}-")


def picked(name: str, patterns: tuple[str, ...]) -> bool:
    """Whether `--file`'s globs (none: every export) take the export `name`."""
    return not patterns or any(fnmatch.fnmatch(name, pattern) for pattern in patterns)


def failure_table(failures: dict[tuple[str, str], str]) -> str:
    rows = ["| tool | export | could not export: the tool's error |", "|---|---|---|"]
    rows += [
        f"| {tool} | {name} | {reason.replace('|', '/')[:200]} |" for (tool, name), reason in sorted(failures.items())
    ]
    return "\n".join(rows)


@click.command(help=__doc__, context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("exports", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--tool", "tools", multiple=True, help="Only these tools' folders (repeatable).")
@click.option("--trtfuse", "trtfuse_command", default="trtfuse", show_default=True, help="How to call trtfuse.")
@click.option("--cwd", type=click.Path(exists=True, file_okay=False, path_type=Path), help="Run trtfuse from here.")
@click.option("--jobs", default=1, show_default=True, help="Exports surveyed at once.")
@click.option("--file", "files", multiple=True, help="Only the exports whose file name matches this glob (repeatable).")
@click.option(
    "--skip",
    multiple=True,
    type=click.Choice(["inspect", "compile"]),
    help="Leave out this command (repeatable); fuse and check always run.",
)
@click.option(
    "--generate",
    default=0,
    type=click.IntRange(min=0),
    help="Also run `check --generate N` on the exports with a KV cache (0: not run).",
)
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), required=True, help="The JSON written.")
@click.option("--markdown", type=click.Path(dir_okay=False, path_type=Path), help="Also write the tables here.")
def main(
    exports: Path,
    tools: tuple[str, ...],
    trtfuse_command: str,
    cwd: Path | None,
    jobs: int,
    files: tuple[str, ...],
    skip: tuple[str, ...],
    generate: int,
    out: Path,
    markdown: Path | None,
) -> None:
    trtfuse = shlex.split(trtfuse_command)
    steps = Steps(inspect="inspect" not in skip, compile="compile" not in skip, generate=generate)
    work = []
    failures = {}

    for manifest_path in sorted(exports.glob("*/expected.json")):
        manifest = json.loads(manifest_path.read_text())
        if not tools or manifest["tool"] in tools:
            failures.update(
                {
                    (manifest["tool"], name): reason
                    for name, reason in manifest["failures"].items()
                    if picked(name, files)
                }
            )
            folder = manifest_path.parent
            work += [
                (manifest["tool"], folder / name, entry)
                for name, entry in manifest["files"].items()
                if picked(name, files)
            ]
    with tempfile.TemporaryDirectory() as scratch, ThreadPoolExecutor(jobs) as pool:
        pending = [pool.submit(survey_one, trtfuse, cwd, steps, *item, Path(scratch)) for item in work]
        outcomes = []
        for future in as_completed(pending):
            outcomes.append(future.result())
            print(table(outcomes[-1:], generate).splitlines()[-1], flush=True)
    outcomes.sort(key=lambda outcome: (outcome.tool, outcome.architecture, outcome.file))
    out.write_text(json.dumps([asdict(o) for o in outcomes], indent=2) + "\n")
    tables = "\n\n".join((summary(outcomes, generate), table(outcomes, generate), failure_table(failures))) + "\n"
    print(tables)
    if markdown is not None:
        markdown.write_text(tables)


if __name__ == "__main__":
    main()
