"""Every artifact of the matrix compiled into a folder with its manifest; the only part that imports CuTeDSL, and
only inside its functions, so that the check process may import this module."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trtfuse.bench.aot.manifest import manifest_item, spec_from_json, spec_to_json, write_artifact, write_manifest
from trtfuse.bench.aot.matrix import MatrixEntry, entry_name, kind_named, matrix
from trtfuse.kernels.declaration import Tactic


def tactics_of(entry: MatrixEntry) -> tuple[Tactic, ...]:
    from trtfuse.kernels import artifacts

    return getattr(artifacts, entry.kind.tactics)(entry.spec)


def compile_one(kind: str, spec_json: dict[str, Any], tactic: int, stem: str, arch: str, folder: str) -> str:
    """Compile one artifact (through the kernel cache) and write its files; runs in a worker process."""
    from trtfuse.kernels import artifacts

    build = getattr(artifacts, kind_named(kind).build)
    write_artifact(Path(folder), stem, build(spec_from_json(kind, spec_json), Tactic(tactic), arch))
    return stem


def compile_matrix(folder: Path, arch: str, jobs: int, kinds: tuple[str, ...] | None = None) -> dict[str, Any]:
    """Every entry's artifacts for every tactic into `folder`, and the manifest that lists them; an entry `arch`
    cannot run (an FP8 quantizer before sm_89: `artifacts.aot_archs`) is left out of both, and so is one of a kind
    outside `kinds` (None: every kind)."""
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    from trtfuse.kernels.artifacts import aot_archs

    folder.mkdir(parents=True, exist_ok=True)
    items = []
    tasks = []
    for index, entry in enumerate(matrix()):
        if arch not in aot_archs(entry.spec) or (kinds is not None and entry.kind.name not in kinds):
            continue
        name = f"{index:03d}-{entry_name(entry)}"
        spec = spec_to_json(entry.spec)
        stems = {}
        for tactic in tactics_of(entry):
            stems[tactic.name] = f"{name}-{tactic.name.lower()}"
            tasks.append((entry.kind.name, spec, int(tactic), stems[tactic.name]))
        items.append(manifest_item(entry, stems))
    # Separate processes, not threads: CuTeDSL compiles under a process-wide lock.
    with ProcessPoolExecutor(max_workers=jobs, mp_context=get_context("spawn")) as pool:
        futures = [pool.submit(compile_one, *task, arch, str(folder)) for task in tasks]
        for done, future in enumerate(futures, 1):
            future.result()
            if done % 25 == 0 or done == len(futures):
                print(f"compiled {done}/{len(futures)} artifacts", flush=True)
    return write_manifest(folder, arch, items)
