"""TensorRT's layer information of a built engine, read: what `IEngineInspector.get_engine_information(JSON)` returns
and `trtexec --profilingVerbosity=detailed --exportLayerInfo=FILE` writes (the same string, as is).

Read tolerantly across TensorRT 8.x, 10.x and 11.x (`../shared/trt-layer-info/FORMAT.md` of the project gives each
key with its source; docs/engine.md, "How the engine runs", says what is read from real files and what is guessed):

- the I/O tensor list is `Bindings` (names, 8.x-10.x) or `I/O Tensors` (objects with a `Name`, 11.x);
- a tensor's data type is in `Format/Datatype` (8.x-10.x: a bare type name such as `Half` on Myelin layers and without
  an execution context, else a format description such as `Row major linear FP16 format`), or in `Datatype` /
  `DataType` beside a `Format` (11.x); `tensor_dtype` reads every spelling by one rule;
- Myelin layers (`gemm`, `kgen`, `shape_call`) have no `Location`, `ParameterType` or `TacticValue`;
- `Metadata` lists the ONNX nodes a layer runs, `[ONNX Layer: NAME]` entries joined by U+001E (Cask layers) or
  U+001F (Myelin layers); files without it (before TensorRT 8.6) are read by the layer's name instead;
- with several optimisation profiles, names of profile N >= 1 carry ` [profile N]`;
- unknown keys and layer types are kept (`Layer.fields`), never refused: a PluginV3 layer's type has not been seen in
  any public output.

A file built without detailed profiling verbosity lists the layers' names only; it is refused with one line saying how
to rebuild. Anything that is not layer information is one line naming the file (exit status 2 in the CLI).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trtfuse.errors import TrtfuseError, first_line
from trtfuse.files import check_readable

# The dtype names every reader of an engine uses: the contract's for the quantized and float types, TensorRT's own
# spelling for the rest.
FP8 = "float8_e4m3fn"
INT8 = "int8"
QUANTIZED_DTYPES = (FP8, INT8)
FLOAT_DTYPES = ("float32", "float16", "bfloat16")

# Checked in this order: `BFloat16` holds `Float`, `UInt8` holds `Int8`, `Row major linear FP32` holds no `FP8`.
_DTYPE_RULES = (
    (FP8, ("fp8", "e4m3")),
    ("fp4", ("fp4",)),
    ("int4", ("int4",)),
    ("uint8", ("uint8",)),
    (INT8, ("int8",)),
    ("bfloat16", ("bfloat16", "bf16")),
    ("float16", ("half", "fp16")),
    ("float32", ("float", "fp32")),
    ("int32", ("int32",)),
    ("int64", ("int64",)),
    ("bool", ("bool",)),
)

_PROFILE = re.compile(r" \[profile (\d+)\]")
_ONNX_ENTRY = "[ONNX Layer: "
# Metadata's separators: U+001E between a Cask layer's ONNX origins, U+001F between a Myelin layer's.
_METADATA_SEPARATORS = re.compile("[\x1e\x1f]")
# Names of Myelin kernels and regions: `__myl_*`, `__mye*`, `*_myl<R>_<i>`, `{ForeignNode[...]}`; their ONNX names
# are mangled (`.` becomes `_`, siblings joined by `+`), so they are not read as ONNX node names.
_MYELIN_NAME = re.compile(r"^__my[le]|_myl\d+_\d+$|^\{ForeignNode\[")
# TensorRT's own names for what it inserted, never an ONNX node's.
_INSERTED_NAME = re.compile(r"^(Reformatting CopyNode|copied_|\(Unnamed Layer\*)")
NAMES_ONLY_HINT = (
    "rebuild the engine with `trtexec --profilingVerbosity=detailed` (Python: config.profiling_verbosity = "
    "trt.ProfilingVerbosity.DETAILED)"
)


def tensor_dtype(text: str) -> str | None:
    """The data type a TensorRT tensor description names, by FORMAT.md's practical rule: `FP8` (or `E4M3`) is FP8,
    `int8` in any case is INT8 (not `UInt8`), `Half` / `FP16` is float16, `BFloat16` bfloat16, `Float` / `FP32`
    float32; bare type names (`Int32`, `Bool`) and format descriptions (`Row major Int8 format`) alike. None for a
    text that names no type (`N/A`, an unknown format)."""
    lowered = text.lower()
    for dtype, words in _DTYPE_RULES:
        if any(word in lowered for word in words):
            return dtype
    return None


def profile_of(name: str) -> int:
    """The optimisation profile a layer or tensor name belongs to: N for a name holding ` [profile N]`, else 0."""
    match = _PROFILE.search(name)
    return int(match.group(1)) if match else 0


def base_name(name: str) -> str:
    """The name without its ` [profile N]` mark (profile 0's spelling of the same layer or tensor)."""
    return _PROFILE.sub("", name)


def in_profile(name: str, profile: int) -> str:
    """A network tensor's name as profile `profile`'s layers list it (`x [profile 1]`)."""
    return name if profile == 0 else f"{name} [profile {profile}]"


@dataclass(frozen=True)
class LayerTensor:
    """One entry of a layer's `Inputs` or `Outputs`: its name, data type (None where the text names none), the text
    TensorRT wrote for it (`Format/Datatype`, or 11.x's `Datatype` and `Format` joined by `; `), its dims (-1 for a
    dynamic one; None where absent) and `Location` (absent on Myelin layers)."""

    name: str
    dtype: str | None
    format: str
    dims: tuple[int, ...] | None
    location: str | None

    @property
    def quantized(self) -> bool:
        return self.dtype in QUANTIZED_DTYPES

    @property
    def floating(self) -> bool:
        return self.dtype in FLOAT_DTYPES


@dataclass(frozen=True, eq=False)
class Layer:
    """One engine layer, equal only to itself (two layers of one engine may share a name). `onnx_nodes` are the ONNX
    nodes it runs: `Metadata`'s entries where it has any, else (files without `Metadata`, before TensorRT 8.6) the
    node names its own name joins with ` + ` (none for Myelin and inserted layers); `onnx_from` says which
    ("metadata", "name" or "none"). `tactic` is `TacticName`, else `TacticValue` (Myelin layers have only the name).
    `fields` holds every key as read, unknown ones included."""

    index: int
    name: str
    layer_type: str
    inputs: tuple[LayerTensor, ...]
    outputs: tuple[LayerTensor, ...]
    parameter_type: str | None
    origin: str | None
    tactic_name: str | None
    tactic_value: str | None
    onnx_nodes: tuple[str, ...]
    onnx_from: str
    fields: Mapping[str, Any] = field(repr=False)

    @property
    def profile(self) -> int:
        return profile_of(self.name)

    @property
    def base_name(self) -> str:
        return base_name(self.name)

    @property
    def tactic(self) -> str | None:
        return self.tactic_name or self.tactic_value

    @property
    def kind(self) -> str:
        """`ParameterType` where TensorRT gives it (the layer kind behind a runner such as `CaskConvolution`), else
        `LayerType`, as TensorRT Engine Explorer reads it."""
        return self.parameter_type or self.layer_type

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "type": self.layer_type, "tactic": self.tactic}


@dataclass(frozen=True)
class LayerInformation:
    """The layers of one engine in engine order, and its I/O tensors' names; `io_key` is the key that listed them
    (`Bindings` up to TensorRT 10, `I/O Tensors` from 11; None where neither is present)."""

    source: str
    layers: tuple[Layer, ...]
    io_tensors: tuple[str, ...]
    io_key: str | None

    @property
    def profiles(self) -> tuple[int, ...]:
        """The optimisation profiles the layers belong to, ascending."""
        return tuple(sorted({layer.profile for layer in self.layers}))

    def in_profile(self, profile: int) -> tuple[Layer, ...]:
        """The layers of one optimisation profile; every engine has profile 0."""
        return tuple(layer for layer in self.layers if layer.profile == profile)


def read_text_file(path: Path, what: str) -> str:
    """A UTF-8 file TensorRT's tools wrote (`what` names it in errors): one line for a missing or unreadable one."""
    check_readable(path, what)
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise TrtfuseError(f"{path}: cannot read the {what}: {first_line(error)}") from None


def read_layer_information(path: Path) -> LayerInformation:
    """The layer information in `path` (`trtexec --exportLayerInfo`'s file); one line naming it for anything else."""
    return parse_layer_information(read_text_file(path, "layer information file"), str(path))


def parse_layer_information(text: str, source: str = "the layer information") -> LayerInformation:
    """The engine inspector's JSON string, read; errors name `source`."""
    try:
        data = json.loads(text)
    except ValueError as error:
        raise TrtfuseError(
            f"{source}: not JSON ({first_line(error)}); expected what `trtexec --exportLayerInfo` writes"
        ) from None
    if not isinstance(data, dict) or not isinstance(data.get("Layers"), list):
        raise TrtfuseError(
            f'{source}: not TensorRT layer information (no "Layers" list); expected what `trtexec '
            "--profilingVerbosity=detailed --exportLayerInfo=FILE` writes"
        )
    raw_layers = data["Layers"]
    if raw_layers and all(isinstance(layer, str) for layer in raw_layers):
        raise TrtfuseError(
            f"{source}: the engine was built without detailed profiling verbosity, so its layer information names "
            f"the layers only; {NAMES_ONLY_HINT}"
        )
    layers = tuple(_layer(index, raw, source) for index, raw in enumerate(raw_layers))
    io_key, io_tensors = _io_tensors(data, source)
    return LayerInformation(source=source, layers=layers, io_tensors=io_tensors, io_key=io_key)


def _io_tensors(data: Mapping[str, Any], source: str) -> tuple[str | None, tuple[str, ...]]:
    for key in ("Bindings", "I/O Tensors"):
        entries = data.get(key)
        if entries is None:
            continue
        if not isinstance(entries, list):
            raise TrtfuseError(f'{source}: "{key}" is not a list')
        names = [entry.get("Name") if isinstance(entry, dict) else entry for entry in entries]
        if not all(isinstance(name, str) for name in names):
            raise TrtfuseError(f'{source}: "{key}" must list tensor names (or objects with a "Name")')
        return key, tuple(names)
    return None, ()


def _text(raw: Mapping[str, Any], key: str, where: str) -> str | None:
    value = raw.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise TrtfuseError(f'{where}: "{key}" is {type(value).__name__}, not a string')
    return value


def _layer(index: int, raw: Any, source: str) -> Layer:
    if not isinstance(raw, dict):
        raise TrtfuseError(f"{source}: layer {index} is {type(raw).__name__}, not an object")
    name = raw.get("Name")
    if not isinstance(name, str):
        raise TrtfuseError(f'{source}: layer {index} has no "Name"')
    where = f"{source}: layer '{name}'"
    metadata = _text(raw, "Metadata", where)
    onnx_nodes, onnx_from = _onnx_nodes(name, metadata)
    tactic_value = raw.get("TacticValue")
    return Layer(
        index=index,
        name=name,
        layer_type=_text(raw, "LayerType", where) or "",
        inputs=_tensors(raw, "Inputs", where),
        outputs=_tensors(raw, "Outputs", where),
        parameter_type=_text(raw, "ParameterType", where),
        origin=_text(raw, "Origin", where),
        tactic_name=_text(raw, "TacticName", where) or None,
        tactic_value=None if tactic_value is None else str(tactic_value),
        onnx_nodes=onnx_nodes,
        onnx_from=onnx_from,
        fields=raw,
    )


def _tensors(raw: Mapping[str, Any], key: str, where: str) -> tuple[LayerTensor, ...]:
    entries = raw.get(key, [])
    if not isinstance(entries, list):
        raise TrtfuseError(f'{where}: "{key}" is not a list')
    return tuple(_tensor(entry, f"{where} {key}[{position}]") for position, entry in enumerate(entries))


def _tensor(raw: Any, where: str) -> LayerTensor:
    if not isinstance(raw, dict) or not isinstance(raw.get("Name"), str):
        raise TrtfuseError(f'{where}: not a tensor (an object with a "Name")')
    # 8.x-10.x: one `Format/Datatype` text; 11.x: the type apart (`Datatype` or `DataType`) beside a `Format`.
    typed = next((raw[key] for key in ("Datatype", "DataType") if isinstance(raw.get(key), str)), None)
    combined = raw.get("Format/Datatype") if isinstance(raw.get("Format/Datatype"), str) else None
    layout = raw.get("Format") if isinstance(raw.get("Format"), str) else None
    texts = [text for text in (typed, combined, layout) if text]
    dtype = next((dtype for text in texts if (dtype := tensor_dtype(text)) is not None), None)
    dims = raw.get("Dimensions")
    readable_dims = isinstance(dims, list) and all(isinstance(dim, int) and not isinstance(dim, bool) for dim in dims)
    location = raw.get("Location")
    return LayerTensor(
        name=raw["Name"],
        dtype=dtype,
        format="; ".join(texts),
        dims=tuple(dims) if readable_dims else None,
        location=location if isinstance(location, str) else None,
    )


def _onnx_nodes(name: str, metadata: str | None) -> tuple[tuple[str, ...], str]:
    """The ONNX nodes a layer runs, and where they were read: its `Metadata` entries, or for a file without
    `Metadata` the names its own name joins."""
    if metadata:
        nodes = metadata_nodes(metadata)
        if nodes:
            return nodes, "metadata"
    if metadata is None:
        nodes = name_nodes(name)
        if nodes:
            return nodes, "name"
    return (), "none"


def metadata_nodes(metadata: str) -> tuple[str, ...]:
    """The ONNX node names of a `Metadata` text: its `[ONNX Layer: NAME]` entries, split on U+001E and U+001F (and,
    where a text lost its separators, between adjacent entries)."""
    nodes: list[str] = []
    for piece in _METADATA_SEPARATORS.split(metadata):
        piece = piece.strip()
        if not (piece.startswith(_ONNX_ENTRY) and piece.endswith("]")):
            continue
        nodes.extend(piece[len(_ONNX_ENTRY) : -1].split("]" + _ONNX_ENTRY))
    return tuple(dict.fromkeys(node for node in nodes if node))


def name_nodes(name: str) -> tuple[str, ...]:
    """The ONNX node names a (non-Myelin) layer name joins: `a + b + PWN(PWN(c), d)` -> a, b, c, d; none for Myelin
    kernels and for what TensorRT inserted (reformats, copies, unnamed layers)."""
    plain = base_name(name)
    if _MYELIN_NAME.search(plain) or _INSERTED_NAME.match(plain):
        return ()
    nodes: list[str] = []
    for part in plain.split(" + "):
        nodes.extend(_unwrapped(part.strip()))
    return tuple(dict.fromkeys(node for node in nodes if node))


def _unwrapped(part: str) -> Sequence[str]:
    """`PWN(PWN(c), d)` -> c, d: the operands of TensorRT's pointwise-fusion wrapper, recursively."""
    if part.startswith("PWN(") and part.endswith(")"):
        return [node for inner in _top_level(part[4:-1]) for node in _unwrapped(inner)]
    return [part]


def _top_level(text: str) -> list[str]:
    """`text` split on the commas outside parentheses."""
    parts, depth, start = [], 0, 0
    for position, char in enumerate(text):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            parts.append(text[start:position].strip())
            start = position + 1
    parts.append(text[start:].strip())
    return parts
