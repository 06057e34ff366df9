"""A folder of compiled artifacts: `<stem>.ptx`, `<stem>.cubin`, `<stem>.json` (the launch declaration) per artifact,
and `manifest.json`, which lists each matrix entry's kernel kind, spec, heads and artifact stem per tactic."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from trtfuse.bench.aot.matrix import KIND_NAMES, MatrixEntry, Spec, kind_named
from trtfuse.contract import NormParams, Quantizer, QuantParams
from trtfuse.kernels.declaration import KernelArtifact, LaunchDeclaration
from trtfuse.kernels.specs import RopeParams

MANIFEST = "manifest.json"
# 2: an entry's kind is its own field ("rms_norm", "add_rms_norm", "qk_norm", "qk_norm_rope"), no longer a key of
# its spec. Format 1
# held no add+norm entries: checking such a folder would pass without launching one, so it is refused.
MANIFEST_FORMAT = 2


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


def spec_to_json(spec: Spec) -> dict[str, Any]:
    """The spec's fields (the weight mode as its int); its kind is the manifest entry's."""
    data = dataclasses.asdict(spec)
    data["params"]["weight_mode"] = int(spec.params.weight_mode)
    return data


def spec_from_json(kind: str, data: Mapping[str, Any]) -> Spec:
    fields = dict(data)
    fields["params"] = NormParams(**fields["params"])
    if fields.get("quant") is not None:
        stages = fields["quant"].items()
        fields["quant"] = QuantParams(**{stage: None if q is None else Quantizer(**q) for stage, q in stages})
    if "rope" in fields:
        fields["rope"] = RopeParams(**fields["rope"])
    return kind_named(kind).spec_type(**fields)


def manifest_item(entry: MatrixEntry, stems: Mapping[str, str]) -> dict[str, Any]:
    """One entry's line of the manifest: its kind, its spec, its heads and its artifact stem per tactic name."""
    heads = None if entry.heads is None else list(entry.heads)
    return {"kind": entry.kind.name, "spec": spec_to_json(entry.spec), "heads": heads, "stems": dict(stems)}


def write_manifest(folder: Path, arch: str, items: list[dict[str, Any]]) -> dict[str, Any]:
    manifest = {"format": MANIFEST_FORMAT, "arch": arch, "entries": items}
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=1))
    return manifest


def read_manifest(folder: Path) -> dict[str, Any]:
    path = folder / MANIFEST
    if not path.is_file():
        raise BadArtifactFolder(f"{path}: no manifest ({compile_hint(folder)})")
    manifest = json.loads(path.read_text())
    found = manifest.get("format")
    if found != MANIFEST_FORMAT:
        raise BadArtifactFolder(
            f"{path}: manifest format {found!r}, this check reads format {MANIFEST_FORMAT} ({compile_hint(folder)})"
        )
    # Every kind before any launch: an unknown one would otherwise stop the run half-way with a traceback.
    unknown = sorted({item.get("kind") for item in manifest["entries"]} - set(KIND_NAMES), key=repr)
    if unknown:
        raise BadArtifactFolder(f"{path}: kernel kind {unknown[0]!r} is not one of {list(KIND_NAMES)}")
    return manifest


def manifest_entries(manifest: Mapping[str, Any]) -> Iterator[tuple[MatrixEntry, dict[str, str]]]:
    for item in manifest["entries"]:
        heads = None if item["heads"] is None else tuple(item["heads"])
        yield MatrixEntry(spec_from_json(item["kind"], item["spec"]), heads), item["stems"]
