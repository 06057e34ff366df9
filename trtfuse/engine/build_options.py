"""What a build is asked for: `BuildOptions`, and the plugin kind policy (`plugin_kind_for`: AOT where trtfuse
builds AOT plugins with the installed TensorRT, else Python)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from trtfuse.contract import PluginKind
from trtfuse.engine.profiles import Profile
from trtfuse.engine.tensorrt import import_tensorrt
from trtfuse.errors import Choice, MissingDependencyError, OptionError, TrtfuseError

# TensorRT documents builder optimisation levels 0 (fastest build) to 5 (most tactics); 3 is its default.
OPTIMIZATION_LEVELS = range(6)
DEFAULT_OPTIMIZATION_LEVEL = 3


@dataclass(frozen=True)
class BuildOptions:
    profiles: tuple[Profile, ...]
    optimization_level: int = DEFAULT_OPTIMIZATION_LEVEL
    workspace_bytes: int | None = None
    timing_cache: Path | None = None
    # TensorRT allows TF32 for fp32 matmuls by default; that is about fp16-level error, so an fp32 model would fail
    # the fp32 tolerance of `trtfuse compare`. Off unless asked for.
    allow_tf32: bool = False
    # None: AOT where trtfuse builds AOT plugins with the installed TensorRT (>= 10.14), else Python
    # (`plugin_kind_for`); the sidecar records the kind used.
    plugins: PluginKind | None = None

    def __post_init__(self) -> None:
        if not self.profiles:
            raise TrtfuseError("an engine needs at least one optimisation profile")
        if self.optimization_level not in OPTIMIZATION_LEVELS:
            raise TrtfuseError(f"the optimisation level must be 0 to 5, got {self.optimization_level}")
        if self.workspace_bytes is not None and self.workspace_bytes <= 0:
            raise TrtfuseError(f"the workspace limit must be positive, got {self.workspace_bytes} bytes")

    def to_json(self) -> dict:
        return {
            "strongly_typed": True,
            "optimization_level": self.optimization_level,
            "workspace_bytes": self.workspace_bytes,
            "timing_cache": str(self.timing_cache) if self.timing_cache else None,
            "allow_tf32": self.allow_tf32,
            "plugins": None if self.plugins is None else self.plugins.value,
        }


def plugin_kind_for(requested: PluginKind | None, aot_refusal: str | None) -> PluginKind:
    """The plugin kind to build with: as requested, or by default AOT where trtfuse builds AOT plugins with this
    TensorRT (`aot_refusal` None) and Python otherwise. AOT asked for where it is refused: one line with the reason."""
    if requested is None:
        return PluginKind.AOT if aot_refusal is None else PluginKind.PYTHON
    if requested is PluginKind.AOT and aot_refusal is not None:
        from trtfuse.plugins.registry import min_tensorrt_text

        raise OptionError(
            "plugins",
            f"{aot_refusal}; trtfuse builds AOT plugins with TensorRT >= {min_tensorrt_text()}: install it or build "
            "with ",
            Choice("plugins"),
            f" {PluginKind.PYTHON.value}",
        )
    return requested


def aot_refusal_of(trt: ModuleType) -> str | None:
    """Why trtfuse builds no AOT plugins with `trt` (`plugins.registry.aot_refusal`), or None."""
    from trtfuse.plugins.registry import aot_refusal

    return aot_refusal(trt)


def quant_refusal_of(trt: ModuleType, dtypes: set[str]) -> str | None:
    """Why `trt` cannot build plugin nodes with outputs in the quantized `dtypes` (`plugins.registry.quant_refusal`),
    or None; None without any."""
    if not dtypes:
        return None
    from trtfuse.plugins.registry import quant_refusal

    return quant_refusal(trt, dtypes)


def check_plugin_kind(requested: PluginKind | None) -> None:
    """Fail before any work when AOT is asked for and the installed TensorRT has none; without TensorRT, say
    nothing: the build says it is missing once the model is fused."""
    if requested is not PluginKind.AOT:
        return
    try:
        trt = import_tensorrt()
    except MissingDependencyError:
        return
    plugin_kind_for(requested, aot_refusal_of(trt))
