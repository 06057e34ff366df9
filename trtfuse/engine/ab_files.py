"""The A/B's files beside the engine, in trtexec's formats so TensorRT Engine Explorer (trex) and users' scripts read
them: the kept engine's per-layer profile per optimisation profile (NAME.engine.profileN.json, as `trtexec
--exportProfile` writes it), and TensorRT alone's layer information and per-layer profiles
(NAME.engine.baseline.layers.json, NAME.engine.baseline.profileN.json)."""

from __future__ import annotations

from pathlib import Path

from trtfuse.engine.baseline import BaselineRun
from trtfuse.engine.layer_profile import write_layer_information
from trtfuse.engine.sidecar import baseline_path, layer_information_path, layer_profile_path
from trtfuse.files import write_bytes_atomic


def ab_files(engine_path: Path, run: BaselineRun) -> dict[str, list[str]]:
    """Write the A/B's files; their names, per engine, for the sidecar and the report."""
    alone = baseline_path(engine_path)
    written: dict[str, list[str]] = {"trtfuse": [], "baseline": []}
    for label, profiles, target in (
        ("trtfuse", run.kept_profiles, engine_path),
        ("baseline", run.baseline_profiles, alone),
    ):
        for runs in profiles:
            path = layer_profile_path(target, runs.profile_index)
            write_bytes_atomic(path, runs.text().encode("utf-8"))
            written[label].append(path.name)
    if run.baseline_layers is not None:
        path = layer_information_path(alone)
        write_layer_information(path, run.baseline_layers)
        written["baseline"].append(path.name)
    return written
