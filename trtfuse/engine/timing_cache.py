"""The timing cache `compile --timing-cache FILE` reads and rewrites, keyed by the trtfuse version that wrote it.

TensorRT keys a cached timing by the layer; for a plugin layer, by the plugin's timing-cache ID as well. The Python
plugins put the trtfuse version in theirs (`plugins.python.base.timing_cache_id`); the AOT plugins keep
tensorrt.plugin's default, the empty ID (caching on, keyed by shapes and formats only). So a cache an AOT build of
another trtfuse wrote could hand `aot_impl` a tactic this trtfuse no longer offers, or one whose kernel has changed.
Hence a stamp beside the cache, `FILE.trtfuse.json`, naming the trtfuse that wrote it: an AOT build reads only a
cache stamped with its own version and otherwise starts a fresh one (saying so); every build writes the stamp.
"""

from __future__ import annotations

from pathlib import Path

from trtfuse.contract import PluginKind
from trtfuse.errors import TrtfuseError
from trtfuse.files import json_object, write_bytes_atomic, write_json_atomic

STAMP_FORMAT = "trtfuse-timing-cache/1"


def stamp_path(cache: Path) -> Path:
    return cache.with_name(cache.name + ".trtfuse.json")


def is_stamp(path: Path) -> bool:
    """Whether the file at `path` is a stamp trtfuse wrote, which a build may replace."""
    stamp = json_object(path)
    return stamp is not None and stamp.get("format") == STAMP_FORMAT


def _stamped_version(cache: Path) -> str | None:
    """The trtfuse version the stamp beside `cache` names; None without a readable stamp of this format."""
    stamp = json_object(stamp_path(cache))
    if stamp is None or stamp.get("format") != STAMP_FORMAT or not isinstance(stamp.get("trtfuse"), str):
        return None
    return stamp["trtfuse"]


def read_timing_cache(path: Path | None, plugins: PluginKind, version: str) -> tuple[bytes, str | None]:
    """The cache to start the build from (empty for a fresh one) and, where a cache on disk is set aside, the line
    that says why: for AOT plugins, a cache not stamped by trtfuse `version`."""
    if path is None or not path.exists():
        return b"", None
    if plugins is PluginKind.AOT:
        written_by = _stamped_version(path)
        if written_by != version:
            by = f"by trtfuse {written_by}" if written_by else "without trtfuse's stamp"
            return b"", (
                f"timing cache {path} was written {by}; this is trtfuse {version}, whose AOT plugins' tactics it may "
                "not hold (their timing-cache ID is empty), so starting a fresh one"
            )
    try:
        return path.read_bytes(), None
    except OSError as error:
        raise TrtfuseError(f"{path}: cannot read the timing cache ({error.strerror})") from None


def write_timing_cache(path: Path, data: memoryview, version: str) -> None:
    """The cache and, beside it, the stamp naming the trtfuse that wrote it."""
    write_bytes_atomic(path, data)
    write_json_atomic(stamp_path(path), {"format": STAMP_FORMAT, "trtfuse": version})
