"""Every artifact of a compiled folder loaded from its PTX and from its cubin, every launch case run on each and
compared with the float64 reference; the report, and its printed summary."""

from __future__ import annotations

import dataclasses
import itertools
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from trtfuse.bench.aot.cases import NULL_POINTER_CASES, LaunchCase, launch_cases
from trtfuse.bench.aot.compare import compare_part
from trtfuse.bench.aot.driver import DriverKernel, bind_torch_context, captured_launch
from trtfuse.bench.aot.isolation import forbidden_imported
from trtfuse.bench.aot.manifest import MANIFEST, BadArtifactFolder, manifest_entries, read_artifact, read_manifest
from trtfuse.bench.aot.matrix import MatrixEntry
from trtfuse.bench.aot.tensors import CaseTensors
from trtfuse.kernels.device import arch_for, driver_version, ptx_driver_problem

IMAGES = ("ptx", "cubin")
GRAPH_REPLAYS = 2
SHOWN_FAILURES = 40


@dataclass(frozen=True)
class CaseResult:
    artifact: str
    image: str
    case: str
    passed: bool
    detail: str = ""
    max_abs_err: float = 0.0
    worst_tolerance_ratio: float = 0.0  # max over elements of |y - ref| / (atol + rtol |ref|); <= 1 passes


def run_case(kernel: DriverKernel, entry: MatrixEntry, case: LaunchCase, stem: str) -> CaseResult:
    """Launch one case (directly, or as replays of a captured graph) and compare every part's outputs."""
    tensors = CaseTensors(entry, kernel.declaration, case)
    pointers = tensors.pointers()
    replays = 1
    if case.graph:
        graph = captured_launch(kernel, pointers, tensors.rows, tensors.extents)
        replays = GRAPH_REPLAYS
    max_abs = worst = 0.0
    for replay in range(replays):
        if case.graph:
            if replay:
                tensors.refresh()
            graph.replay()
        else:
            kernel.launch(pointers, tensors.rows, torch.cuda.current_stream().cuda_stream, tensors.extents)
        torch.cuda.synchronize()
        for part in tensors.parts.values():
            # No part prefix: the detail names the failing output's parameter (y, h, q_out, ...).
            passed, detail, part_abs, part_worst = compare_part(entry.spec, part)
            max_abs, worst = max(max_abs, part_abs), max(worst, part_worst)
            if not passed:
                where = f"replay {replay}: " if case.graph else ""
                return CaseResult(stem, kernel.image, case.label(), False, where + detail, max_abs, worst)
    return CaseResult(stem, kernel.image, case.label(), True, "", max_abs, worst)


def device_arch_and_sms() -> tuple[str, int]:
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return arch_for(props.major, props.minor), props.multi_processor_count


def context_alive() -> bool:
    """Whether the CUDA context survived an error: a fault is sticky and fails every later synchronize."""
    try:
        torch.cuda.synchronize()
    except RuntimeError:
        return False
    return True


def check_image(
    kernel: DriverKernel, entry: MatrixEntry, stem: str, cases: Sequence[LaunchCase], results: list[CaseResult]
) -> str:
    """Run `cases` on one loaded image into `results`; returns why the run must stop ("" to go on)."""
    for case in cases:
        try:
            results.append(run_case(kernel, entry, case, stem))
        except (RuntimeError, ValueError) as error:
            results.append(CaseResult(stem, kernel.image, case.label(), False, str(error)))
            if not context_alive():
                return f"{stem} {kernel.image} {case.label()}: {error}"
    return ""


def check_artifacts(folder: Path) -> dict[str, Any]:
    """Load every artifact of the manifest (PTX, then cubin) and run every case on each; a CUDA error that loses
    the context ends the run, recorded as the failing case."""
    manifest = read_manifest(folder)
    arch, sm_count = device_arch_and_sms()
    if manifest["arch"] != arch:
        raise BadArtifactFolder(f"{folder / MANIFEST}: artifacts are for {manifest['arch']}, this GPU is {arch}")
    bind_torch_context()
    seed = torch.seed()  # fresh inputs in every run, replayable with torch.manual_seed(seed)
    start = time.perf_counter()
    results: list[CaseResult] = []
    aborted = ""
    driver = driver_version()
    # PTX this driver cannot JIT (an ISA newer than it knows: CuTeDSL built against a newer CUDA) is not loaded, and
    # said so; its cubin still runs. Any other load failure is a failure.
    unloadable: dict[str, str] = {}
    artifacts = [(entry, stem) for entry, stems in manifest_entries(manifest) for stem in stems.values()]
    passes = (lambda declaration: launch_cases(declaration, sm_count), lambda declaration: NULL_POINTER_CASES)
    images = list(itertools.product(artifacts, IMAGES))
    for done, (cases_of, ((entry, stem), image)) in enumerate(itertools.product(passes, images)):
        if done % 50 == 0:
            failed = sum(not r.passed for r in results)
            print(f"image {done + 1}/{len(passes) * len(images)}, {failed} failed cases so far", flush=True)
        artifact = read_artifact(folder, stem)
        problem = ptx_driver_problem(artifact.ptx, driver) if image == "ptx" else None
        if problem is not None:
            unloadable[stem] = problem
            continue
        try:
            kernel = DriverKernel(artifact, image)
        except RuntimeError as error:
            results.append(CaseResult(stem, image, "load", False, str(error)))
            continue
        aborted = check_image(kernel, entry, stem, cases_of(artifact.declaration), results)
        if aborted:
            break
        kernel.unload()
    failed = [r for r in results if not r.passed]
    return {
        "gpu": torch.cuda.get_device_name(),
        "arch": arch,
        "sms": sm_count,
        "seed": seed,
        "artifacts": len(artifacts),
        "cases": len(results),
        "failed": len(failed),
        "aborted": aborted,
        "ptx_not_loadable": unloadable,
        "forbidden_modules_imported": forbidden_imported(),
        "wall_s": time.perf_counter() - start,
        "results": [dataclasses.asdict(r) for r in results],
    }


def print_check(report: Mapping[str, Any]) -> None:
    failed = [r for r in report["results"] if not r["passed"]]
    for r in failed[:SHOWN_FAILURES]:
        print(f"FAIL {r['artifact']} [{r['image']}] {r['case']}: {r['detail']}")
    if len(failed) > SHOWN_FAILURES:
        print(f"... and {len(failed) - SHOWN_FAILURES} more failures (see the JSON)")
    worst = max((r["worst_tolerance_ratio"] for r in report["results"] if r["passed"]), default=0.0)
    print(
        f"\nAOT bare-driver check on {report['gpu']} ({report['arch']}, {report['sms']} SMs): "
        f"{report['artifacts']} artifacts x (ptx, cubin), {report['cases']} cases, {report['failed']} failed; "
        f"worst passing error {worst:.2f} of the allowed; CuTeDSL/TVM-FFI modules imported: "
        f"{report['forbidden_modules_imported'] or 'none'}; {report['wall_s']:.0f} s, torch seed {report['seed']}"
    )
    if report["aborted"]:
        print(f"aborted after a CUDA error: {report['aborted']}")
    unloadable = report.get("ptx_not_loadable") or {}
    if unloadable:
        reasons = sorted(set(unloadable.values()))
        print(f"PTX not loaded for {len(unloadable)} artifacts (their cubins ran): {'; '.join(reasons)}")
