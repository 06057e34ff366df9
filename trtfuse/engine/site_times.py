"""Which engine layers run a site's ONNX nodes, and their time: the attribution that compares an engine of the original
export (TensorRT alone) with the trtfuse engine, norm site by norm site.

A site is a name and the ONNX node names it stands for: a norm of the original export and the nodes the fusion took
in for it (`norm_sites`, from the fusion's records or report), or a trtfuse node of the fused model and its own name
(`node_sites`). A layer runs a site's nodes when its `Metadata` (or, for files without it, its name) names them.

The share rule: a layer naming ONNX nodes of several sites, or nodes outside any site (a Myelin kernel that fused a
norm with the Add before it), counts toward a site by the fraction of the ONNX nodes it names that are the site's;
such a layer is marked shared and its whole time is listed beside the share.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from trtfuse.engine.layer_info import Layer, LayerInformation
from trtfuse.engine.layer_profile import LayerProfile, LayerTime
from trtfuse.errors import TrtfuseError
from trtfuse.fusion.patterns.queries import describe
from trtfuse.fusion.rewrite import FusedNode

SHARE_RULE = (
    "a layer naming ONNX nodes of several sites, or nodes outside any site, counts toward a site by the fraction of "
    "the ONNX nodes it names that are the site's"
)


def norm_sites(fused: Iterable[FusedNode]) -> dict[str, tuple[str, ...]]:
    """Each fused node's name and the ONNX nodes of the original export it took in, for attributing an engine of the
    original export: those it replaced and the Q/DQ nodes of its quantizers (an add-norm's `replaced` leaves its
    output QuantizeLinear out; its quantizers list it)."""
    return {
        node.name: _site_nodes(
            node.replaced, (describe(taken) for quantizer in node.quantizers for taken in quantizer.nodes)
        )
        for node in fused
    }


def report_sites(report: Mapping[str, Any]) -> dict[str, tuple[str, ...]]:
    """`norm_sites` read from a fusion report (`trtfuse fuse --report`, `compile`'s `MODEL.fusion.json`): each entry's
    `replaced` and its quantizers' `nodes`."""
    return {
        entry["name"]: _site_nodes(
            entry["replaced"], (name for stage in entry.get("quant", {}).values() for name in stage["nodes"])
        )
        for entry in report["fused"]
    }


def _site_nodes(replaced: Iterable[str], quantizers: Iterable[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys((*replaced, *quantizers)))


def node_sites(names: Iterable[str]) -> dict[str, tuple[str, ...]]:
    """Each trtfuse node as its own site, for attributing the trtfuse engine by the same sites' names."""
    return {name: (name,) for name in names}


@dataclass(frozen=True)
class AttributedLayer:
    """A layer counted toward a site: the fraction of its time that is the site's (1 unless shared) and its record in
    the profile (None without one, or where the profile does not time it)."""

    layer: Layer
    share: float
    time: LayerTime | None

    @property
    def shared(self) -> bool:
        return self.share < 1.0

    @property
    def average_ms(self) -> float | None:
        return None if self.time is None else self.time.average_ms * self.share

    def to_json(self) -> dict[str, Any]:
        entry = {**self.layer.to_json(), "onnx_nodes": list(self.layer.onnx_nodes)}
        if self.shared:
            entry["shared"] = True
            entry["share"] = self.share
        if self.time is not None:
            entry["layer_average_ms"] = self.time.average_ms
            entry["average_ms"] = self.average_ms
        return entry


@dataclass(frozen=True)
class SiteTime:
    """A site's layers and, with a profile, their time per iteration (the sum of each layer's average times its
    share); `average_ms` is None without a profile."""

    site: str
    nodes: tuple[str, ...]
    layers: tuple[AttributedLayer, ...]
    timed: bool

    @property
    def average_ms(self) -> float | None:
        if not self.timed:
            return None
        return sum(layer.average_ms or 0.0 for layer in self.layers)

    def to_json(self) -> dict[str, Any]:
        return {
            "site": self.site,
            "onnx_nodes": list(self.nodes),
            "layers": [layer.to_json() for layer in self.layers],
            "average_ms": self.average_ms,
        }


def layer_share(layer: Layer, nodes: frozenset[str] | set[str]) -> float:
    """The fraction of `layer` that runs `nodes` (0 when it runs none of them): of the ONNX nodes it names, those in
    `nodes`. A layer named after one of `nodes` (a plugin layer without `Metadata`) runs that node."""
    origins = set(layer.onnx_nodes)
    if layer.base_name in nodes:
        origins.add(layer.base_name)
    if not origins:
        return 0.0
    return len(origins & nodes) / len(origins)


def chosen_profile(info: LayerInformation, profile: LayerProfile | None, engine_profile: int | None) -> int:
    """The optimisation profile whose layers are read: the one asked for, else the one the timed layers' names carry,
    else 0; one line where the layer information has no layer of it."""
    chosen = engine_profile if engine_profile is not None else (profile.engine_profile if profile else 0)
    if chosen not in info.profiles:
        held = ", ".join(map(str, info.profiles)) or "none"
        raise TrtfuseError(f"{info.source}: holds no layer of optimisation profile {chosen} (profiles: {held})")
    return chosen


def layer_times(info: LayerInformation, profile: LayerProfile | None) -> dict[int, LayerTime]:
    """Each timed layer's record by layer index; one line where the profile times none of the layers (a profile of
    another engine)."""
    if profile is None:
        return {}
    times = profile.times_of(info.layers)
    if not times:
        raise TrtfuseError(
            f"{profile.source}: times none of the layers of {info.source}; give the profile of the same engine "
            "(trtexec --exportProfile beside --exportLayerInfo)"
        )
    return times


def attribute_sites(
    info: LayerInformation,
    sites: Mapping[str, Sequence[str]],
    profile: LayerProfile | None = None,
    engine_profile: int | None = None,
) -> tuple[SiteTime, ...]:
    """Each site's layers in one optimisation profile of the engine (`chosen_profile`) and, with a profile, their
    time by the share rule (`SHARE_RULE`)."""
    chosen = chosen_profile(info, profile, engine_profile)
    times = layer_times(info, profile)
    layers = info.in_profile(chosen)
    found = []
    for site, names in sites.items():
        nodes = frozenset(names)
        attributed = tuple(
            AttributedLayer(layer, share, times.get(layer.index))
            for layer in layers
            if (share := layer_share(layer, nodes)) > 0
        )
        found.append(SiteTime(site, tuple(names), attributed, profile is not None))
    return tuple(found)
