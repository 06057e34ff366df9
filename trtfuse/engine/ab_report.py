"""What `compile --baseline` prints and records: per case, TensorRT alone against trtfuse, the difference and its
noise; the time of the layers attributed to the norm sites in each engine; each engine's GPU memory and build time.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from trtfuse.engine.ab import PairMeasurement, ProfiledRuns, TimingSettings
from trtfuse.engine.layer_info import parse_layer_information
from trtfuse.engine.layer_profile import parse_profile
from trtfuse.engine.site_times import attribute_sites

BASELINE_LABEL = "TensorRT alone"
TRTFUSE_LABEL = "trtfuse"


@dataclass(frozen=True)
class SiteTotal:
    """The layers the norm sites of one profile ran in, in one engine, and their time per run (the profiled runs'
    average, ms, shared layers by their share: `site_times.SHARE_RULE`); `shared` of them also ran other ONNX
    nodes."""

    ms: float
    layers: int
    shared: int = 0

    def text(self) -> str:
        shared = f", {self.shared} shared" if self.shared else ""
        return f"{self.ms:.4f} ms in {self.layers} layer{'s' if self.layers != 1 else ''}{shared}"

    def to_json(self) -> dict:
        return {"ms": self.ms, "layers": self.layers, "shared_layers": self.shared}


@dataclass(frozen=True)
class ABReport:
    """The A/B of one compile: the GPU, TensorRT's version, the settings, the measurement, each engine's build time
    (baseline, trtfuse) and, per profile (by name), the norm sites' time in each engine."""

    gpu: str
    tensorrt: str
    settings: TimingSettings
    measurement: PairMeasurement
    build_seconds: tuple[float, float]
    site_times: Mapping[str, tuple[SiteTotal | None, SiteTotal | None]] = field(default_factory=dict)

    @property
    def slower_cases(self) -> list[str]:
        return [t.case.name for t in self.measurement.cases if t.comparison.verdict.value == "slower"]

    def lines(self) -> list[str]:
        m = self.measurement
        graphs = all(all(t.graphs) for t in m.cases)
        replay = "CUDA-graph replay" if graphs else "CUDA-graph replay where TensorRT allowed it (see --json)"
        rows = [
            ("case", BASELINE_LABEL, TRTFUSE_LABEL, "difference", "noise (95 %)", "verdict"),
            *(
                (
                    t.case.name,
                    f"{t.comparison.baseline_ms:.4f} ms",
                    f"{t.comparison.candidate_ms:.4f} ms",
                    f"{t.comparison.difference_ms:+.4f} ms ({100.0 * (t.comparison.ratio - 1.0):+.1f} %)",
                    f"±{t.comparison.noise_ms:.4f} ms",
                    t.comparison.verdict.value,
                )
                for t in m.cases
            ),
        ]
        widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
        table = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows]
        lines = [
            f"A/B on {self.gpu}, TensorRT {self.tensorrt}: {self.settings.rounds} paired rounds per case, "
            f"median ms per run, {replay}",
            *table,
        ]
        for profile, (baseline, trtfuse) in self.site_times.items():
            lines.append(
                f"norm sites at {profile}'s OPT shapes (per-layer profile): {BASELINE_LABEL} "
                f"{baseline.text() if baseline else 'not found'}; {TRTFUSE_LABEL} "
                f"{trtfuse.text() if trtfuse else 'not found'}"
            )
        lines.append(
            f"GPU memory (each engine alone): {BASELINE_LABEL} {_mib(m.memory[0])}, "
            f"{TRTFUSE_LABEL} {_mib(m.memory[1])}; "
            f"build: {BASELINE_LABEL} {self.build_seconds[0]:.1f} s, {TRTFUSE_LABEL} {self.build_seconds[1]:.1f} s"
        )
        return lines

    def to_json(self) -> dict:
        m = self.measurement
        return {
            "gpu": self.gpu,
            "tensorrt": self.tensorrt,
            "settings": self.settings.to_json(),
            "cases": [timing.to_json() for timing in m.cases],
            "slower_cases": self.slower_cases,
            "gpu_memory_bytes": {"baseline": m.memory[0], "trtfuse": m.memory[1]},
            "build_seconds": {"baseline": self.build_seconds[0], "trtfuse": self.build_seconds[1]},
            "norm_sites": {
                profile: {
                    "baseline": None if baseline is None else baseline.to_json(),
                    "trtfuse": None if trtfuse is None else trtfuse.to_json(),
                }
                for profile, (baseline, trtfuse) in self.site_times.items()
            },
        }


def _mib(size: int) -> str:
    return f"{size / (1 << 20):.1f} MiB"


def site_total(layer_information: str, sites: Mapping[str, Sequence[str]], runs: ProfiledRuns) -> SiteTotal | None:
    """The norm sites' layers and time in one engine at one profile's OPT shapes, from its layer information and the
    per-layer profile written beside it (the same text, read back); None where no layer runs a site's nodes."""
    info = parse_layer_information(layer_information)
    profile = parse_profile(runs.text())
    attributed = attribute_sites(info, sites, profile, engine_profile=runs.profile_index)
    layers = {item.layer.index: item for site in attributed for item in site.layers}
    if not layers:
        return None
    shared = sum(item.shared for item in layers.values())
    return SiteTotal(sum(site.average_ms or 0.0 for site in attributed), len(layers), shared)
