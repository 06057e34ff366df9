"""A folder of compiled artifacts: `<stem>.ptx`, `<stem>.cubin`, `<stem>.json` (the launch declaration) per artifact,
and `manifest.json`, which lists each matrix entry's spec, heads and artifact stem per tactic."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from trtfuse.bench.aot.matrix import MatrixEntry
from trtfuse.contract import NormParams
from trtfuse.kernels.declaration import KernelArtifact, LaunchDeclaration
from trtfuse.kernels.specs import QkNormSpec, RmsNormSpec

MANIFEST = "manifest.json"
MANIFEST_FORMAT = 1


class BadArtifactFolder(Exception):
    """An artifact folder `check` cannot use: reported in one line, exit status 2."""


def compile_hint(folder: Path) -> str:
    return f"run `python -m trtfuse.bench.aot compile --out {folder}`"


def write_artifact(folder: Path, stem: str, artifact: KernelArtifact) -> None:
    (folder / f"{stem}.ptx").write_text(artifact.ptx)
    (folder / f"{stem}.cubin").write_bytes(artifact.cubin)
    (folder / f"{stem}.json").write_text(artifact.declaration.dumps())


def read_artifact(folder: Path, stem: str) -> KernelArtifact:
    paths = [folder / f"{stem}.{suffix}" for suffix in ("json", "ptx", "cubin")]
    for path in paths:
        if not path.is_file():
            raise FileNotFoundError(f"{path}: artifact file missing ({compile_hint(folder)})")
    declaration = LaunchDeclaration.from_json(json.loads(paths[0].read_text()))
    return KernelArtifact(declaration, paths[1].read_text(), paths[2].read_bytes())


def spec_to_json(spec: RmsNormSpec | QkNormSpec) -> dict[str, Any]:
    data = dataclasses.asdict(spec)
    data["params"]["weight_mode"] = int(spec.params.weight_mode)
    data["kind"] = "rms_norm" if hasattr(spec, "hidden") else "qk_norm"
    return data


def spec_from_json(data: Mapping[str, Any]) -> RmsNormSpec | QkNormSpec:
    fields = {key: value for key, value in data.items() if key != "kind"}
    fields["params"] = NormParams(**fields["params"])
    kinds = {"rms_norm": RmsNormSpec, "qk_norm": QkNormSpec}
    if data.get("kind") not in kinds:
        raise ValueError(f"spec kind {data.get('kind')!r} is not one of {sorted(kinds)}")
    return kinds[data["kind"]](**fields)


def manifest_item(entry: MatrixEntry, stems: Mapping[str, str]) -> dict[str, Any]:
    """One entry's line of the manifest: its spec, its heads and its artifact stem per tactic name."""
    heads = None if entry.heads is None else list(entry.heads)
    return {"spec": spec_to_json(entry.spec), "heads": heads, "stems": dict(stems)}


def write_manifest(folder: Path, arch: str, items: list[dict[str, Any]]) -> dict[str, Any]:
    manifest = {"format": MANIFEST_FORMAT, "arch": arch, "entries": items}
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=1))
    return manifest


def read_manifest(folder: Path) -> dict[str, Any]:
    path = folder / MANIFEST
    if not path.is_file():
        raise BadArtifactFolder(f"{path}: no manifest ({compile_hint(folder)})")
    manifest = json.loads(path.read_text())
    if manifest.get("format") != MANIFEST_FORMAT:
        raise BadArtifactFolder(f"{path}: manifest format {manifest.get('format')!r}, expected {MANIFEST_FORMAT}")
    return manifest


def manifest_entries(manifest: Mapping[str, Any]) -> Iterator[tuple[MatrixEntry, dict[str, str]]]:
    for item in manifest["entries"]:
        heads = None if item["heads"] is None else tuple(item["heads"])
        yield MatrixEntry(spec_from_json(item["spec"]), heads), item["stems"]
