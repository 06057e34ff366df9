"""Load and save ONNX models without ever reading the large external weight payloads.

Large LLM exports keep their weights in external data files. The pass only needs the small tensors (norm weights,
epsilons, shapes), so `load_model` reads external tensors of at most `SMALL_TENSOR_BYTES` into the proto and leaves the
rest as references to files next to the model. `save_model` keeps those references valid in the output folder.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from google.protobuf.message import DecodeError
from onnx import external_data_helper, helper

from trtfuse import __version__, contract
from trtfuse.errors import TrtfuseError, first_line
from trtfuse.files import (
    Transaction,
    atomic_file,
    check_readable,
    check_writable,
    copy_sparse,
    is_inside,
    make_folders,
    onnx_model_at,
    resolved,
    same_content,
)

MIN_OPSET = 13
MAX_OPSET = 23
SMALL_TENSOR_BYTES = 1 << 20
# Protobuf cannot serialise a message of 2 GiB or more; what is left inline must stay below it.
MAX_PROTO_BYTES = (1 << 31) - 1
DEFAULT_DOMAINS = ("", "ai.onnx")
# onnxruntime registers these contrib ops in the default ONNX domain too (its transformers optimizer writes them
# there), where onnx.checker has no schema for them; the checker then looks at them in onnxruntime's own domain.
ONNXRUNTIME_DOMAIN = "com.microsoft"
ONNXRUNTIME_DEFAULT_DOMAIN_OPS = frozenset({"SimplifiedLayerNormalization"})
# The metadata entry (its value: the trtfuse version) a model trtfuse writes carries where it imports no trtfuse opset
# (nothing fused), so that a later call knows it may replace the file; a fused model is known by its opset, and its
# bytes stay what they were before the entry existed.
WRITTEN_BY_KEY = "written_by_trtfuse"
_UNSIZED_TYPES = {onnx.TensorProto.STRING, onnx.TensorProto.UNDEFINED}
_FOUR_BIT_TYPES = {onnx.TensorProto.INT4, onnx.TensorProto.UINT4, onnx.TensorProto.FLOAT4E2M1}


@dataclass(frozen=True)
class LoadedModel:
    """A validated model; `path` locates the external data files that `model`'s large tensors still reference.

    `data_files` are all the external data files the file on disk references, those read into `model` included.
    """

    model: onnx.ModelProto
    path: Path
    data_files: tuple[Path, ...] = ()

    @property
    def files(self) -> tuple[Path, ...]:
        """Every file the model is read from: the .onnx and its external data files (what no output may replace)."""
        return (self.path, *self.data_files)


@dataclass(frozen=True)
class _ExternalRef:
    location: str
    offset: int
    length: int


def iter_tensors(model: onnx.ModelProto) -> Iterator[onnx.TensorProto]:
    """Every tensor proto of the model: initializers and node attributes, the values and indices of sparse ones
    (which may hold external data too), subgraphs and functions included."""
    for tensor in _stored_tensors(model):
        if isinstance(tensor, onnx.SparseTensorProto):
            yield tensor.values
            yield tensor.indices
        else:
            yield tensor


def _sparse_tensors(model: onnx.ModelProto) -> list[onnx.SparseTensorProto]:
    return [tensor for tensor in _stored_tensors(model) if isinstance(tensor, onnx.SparseTensorProto)]


def _stored_tensors(model: onnx.ModelProto) -> Iterator[onnx.TensorProto | onnx.SparseTensorProto]:
    yield from _graph_tensors(model.graph)
    for function in model.functions:
        for node in function.node:
            yield from _node_tensors(node)


def _graph_tensors(graph: onnx.GraphProto) -> Iterator[onnx.TensorProto | onnx.SparseTensorProto]:
    yield from graph.initializer
    yield from graph.sparse_initializer
    for node in graph.node:
        yield from _node_tensors(node)


def _node_tensors(node: onnx.NodeProto) -> Iterator[onnx.TensorProto | onnx.SparseTensorProto]:
    for attribute in node.attribute:
        if attribute.HasField("t"):
            yield attribute.t
        yield from attribute.tensors
        if attribute.HasField("sparse_tensor"):
            yield attribute.sparse_tensor
        yield from attribute.sparse_tensors
        if attribute.HasField("g"):
            yield from _graph_tensors(attribute.g)
        for subgraph in attribute.graphs:
            yield from _graph_tensors(subgraph)


def external_tensors(model: onnx.ModelProto) -> list[onnx.TensorProto]:
    """The tensors whose payload still lives in an external data file."""
    return [tensor for tensor in iter_tensors(model) if external_data_helper.uses_external_data(tensor)]


def load_model(path: str | os.PathLike) -> LoadedModel:
    """Read and validate an ONNX model; every problem is a one-line `TrtfuseError` naming the file or tensor."""
    path = Path(path)
    if path.is_dir() and (path / "config.json").is_file():
        raise TrtfuseError(f"{path}: is a Hugging Face checkpoint folder, not an ONNX model{_export_hint(path)}")
    check_readable(path)
    model = _parse(path)
    _check_opset(model, path)
    _check_names(path, model)
    # Like onnx, resolve external data against the folder the path names, not the target of a symlinked model file.
    folder = path.absolute().parent
    _check_external_data(model, path, folder)
    _check_graph(path, model)
    data_files = tuple(folder / location for location in _locations(model, path))
    for tensor in external_tensors(model):
        ref = _external_ref(tensor, path)
        if ref.length <= SMALL_TENSOR_BYTES:
            try:
                external_data_helper.load_external_data_for_tensor(tensor, str(folder))
            except (OSError, onnx.checker.ValidationError) as error:
                raise TrtfuseError(f"{path}: cannot read tensor '{tensor.name}': {first_line(error)}") from None
    return LoadedModel(model=model, path=path, data_files=data_files)


def _parse(path: Path) -> onnx.ModelProto:
    # Always the binary format: onnx picks its JSON or text parser by the file's extension, whose errors about a
    # checkpoint's config.json or a report would come out as a field ModelProto lacks.
    hint = _export_hint(path.parent) if path.name == "config.json" else ""
    try:
        model = onnx.load(str(path), format="protobuf", load_external_data=False)
    except OSError as error:
        raise TrtfuseError(f"{path}: cannot read: {error.strerror or error}") from None
    except (DecodeError, ValueError, RuntimeError) as error:
        raise TrtfuseError(f"{path}: not an ONNX model ({first_line(error)}){hint}") from None
    # Protobuf parses many non-ONNX byte strings into a message with no fields set.
    if model.ir_version == 0 or not model.HasField("graph"):
        raise TrtfuseError(f"{path}: not an ONNX model (no IR version or no graph){hint}")
    return model


def _export_hint(checkpoint: Path) -> str:
    return f"; export it first: python models/export.py --cache --checkpoint {checkpoint} --out OUT"


def _check_opset(model: onnx.ModelProto, path: Path) -> None:
    versions = [opset.version for opset in model.opset_import if opset.domain in DEFAULT_DOMAINS]
    if not versions:
        raise TrtfuseError(f"{path}: imports no ai.onnx opset (supported: {MIN_OPSET}-{MAX_OPSET})")
    version = versions[0]
    if not MIN_OPSET <= version <= MAX_OPSET:
        raise TrtfuseError(f"{path}: unsupported opset {version} (supported: {MIN_OPSET}-{MAX_OPSET})")


def _external_ref(tensor: onnx.TensorProto, path: Path) -> _ExternalRef:
    fields = {entry.key: entry.value for entry in tensor.external_data}
    location = fields.get("location")
    if not location:
        raise TrtfuseError(f"{path}: tensor '{tensor.name}' has external data without a location")
    if "\0" in location:
        raise TrtfuseError(f"{path}: tensor '{tensor.name}' has an external data location with a NUL byte")
    try:
        offset = int(fields.get("offset", 0))
        length = int(fields.get("length", 0))
        # Without a length, or with a length of 0, onnxruntime reads exactly the tensor's dims times its element size.
        payload = length or _payload_bytes(tensor)
    except (ValueError, TypeError, KeyError):
        raise TrtfuseError(f"{path}: tensor '{tensor.name}' has a malformed external data offset or length") from None
    if offset < 0 or length < 0:
        raise TrtfuseError(
            f"{path}: tensor '{tensor.name}' has a negative external data offset or length ({offset}, {length})"
        )
    return _ExternalRef(location=location, offset=offset, length=payload)


def _payload_bytes(tensor: onnx.TensorProto) -> int:
    element_bits = np.dtype(helper.tensor_dtype_to_np_dtype(tensor.data_type)).itemsize * 8
    if tensor.data_type in _FOUR_BIT_TYPES:
        element_bits = 4
    return (math.prod(tensor.dims) * element_bits + 7) // 8


def _check_external_data(model: onnx.ModelProto, path: Path, folder: Path) -> None:
    sizes: dict[Path, int] = {}
    for tensor in external_tensors(model):
        ref = _external_ref(tensor, path)
        # onnx reads a tensor without a length to the end of its file and one of length 0 as no bytes, onnxruntime
        # only what its shape needs: say so, and every reader (and the fused model) reads what onnxruntime reads.
        _set_length(tensor, ref.length)
        data_path = resolved(folder / ref.location)
        if Path(ref.location).is_absolute() or not is_inside(data_path, folder):
            raise TrtfuseError(
                f"{path}: tensor '{tensor.name}' points outside the model's folder to external data '{ref.location}'"
            )
        if data_path not in sizes:
            if not data_path.is_file():
                raise TrtfuseError(f"{path}: external data file '{ref.location}' of tensor '{tensor.name}' is missing")
            sizes[data_path] = data_path.stat().st_size
        end = ref.offset + ref.length
        if end > sizes[data_path]:
            raise TrtfuseError(
                f"{path}: tensor '{tensor.name}' reads bytes {ref.offset}-{end} of '{ref.location}', "
                f"which holds only {sizes[data_path]}"
            )


def _set_length(tensor: onnx.TensorProto, length: int) -> None:
    lengths = [entry for entry in tensor.external_data if entry.key == "length"]
    if [entry.value for entry in lengths] == [str(length)]:
        return
    kept = [entry for entry in tensor.external_data if entry.key != "length"]
    del tensor.external_data[:]
    tensor.external_data.extend(kept)
    tensor.external_data.add(key="length", value=str(length))


def _check_graph(path: Path, model: onnx.ModelProto) -> None:
    try:
        check_model_file(path, model)
    except onnx.checker.ValidationError as error:
        raise TrtfuseError(f"{path}: fails the ONNX checker: {first_line(error)}") from None
    _check_data_types(path, model)


def _check_names(path: Path, model: onnx.ModelProto) -> None:
    # Protobuf hands out a string field that is not UTF-8 as bytes, which onnx-graphsurgeon cannot write back.
    texts = [model.producer_name, model.producer_version, model.domain, model.doc_string]
    texts += [text for entry in model.metadata_props for text in (entry.key, entry.value)]
    texts += [opset.domain for opset in model.opset_import]
    texts += [
        text for tensor in iter_tensors(model) for entry in tensor.external_data for text in (entry.key, entry.value)
    ]
    for graph in _graphs(model.graph):
        values = (*graph.input, *graph.output, *graph.value_info)
        texts += [graph.name, graph.doc_string, *(value.name for value in (*values, *graph.initializer))]
        texts += [dim.dim_param for value in values for dim in value.type.tensor_type.shape.dim]
        for node in graph.node:
            texts += [node.name, node.op_type, node.domain, node.doc_string, *node.input, *node.output]
            texts += [attribute.name for attribute in node.attribute]
    if not all(isinstance(text, str) for text in texts):
        raise TrtfuseError(f"{path}: holds a name or string that is not valid UTF-8")


def _graphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    yield graph
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.HasField("g"):
                yield from _graphs(attribute.g)
            for subgraph in attribute.graphs:
                yield from _graphs(subgraph)


def _check_data_types(path: Path, model: onnx.ModelProto) -> None:
    # The checker lets an unknown data type through, which onnx-graphsurgeon and numpy cannot represent.
    known = set(onnx.TensorProto.DataType.values())
    for tensor in iter_tensors(model):
        if tensor.data_type not in known:
            raise TrtfuseError(f"{path}: tensor '{tensor.name}' has an unknown data type {tensor.data_type}")
        # The checker refuses too few raw bytes for the shape but not too many, which numpy cannot reshape.
        if tensor.HasField("raw_data") and tensor.data_type not in _UNSIZED_TYPES:
            expected = _payload_bytes(tensor)
            if len(tensor.raw_data) != expected:
                raise TrtfuseError(
                    f"{path}: tensor '{tensor.name}' holds {len(tensor.raw_data)} bytes; its shape and type need "
                    f"{expected}"
                )
    graph = model.graph
    for value in (*graph.input, *graph.output, *graph.value_info):
        if value.type.HasField("tensor_type") and value.type.tensor_type.elem_type not in known:
            raise TrtfuseError(
                f"{path}: value '{value.name}' has an unknown data type {value.type.tensor_type.elem_type}"
            )


def check_model_file(path: Path, model: onnx.ModelProto) -> None:
    """`onnx.checker` on the file at `path` (which holds `model`); raises its ValidationError.

    The path-based checker works for models of any size and resolves external data against the model's folder. Two
    things onnxruntime reads and the checker refuses make it check in memory instead, as onnxruntime reads the model:
    onnxruntime contrib ops in the default domain (moved to onnxruntime's domain, where the checker skips them) and
    graph inputs or outputs that declare no type or no shape (onnxruntime infers them; the check sees a placeholder
    type). A sparse tensor with external data is checked in memory from the start: the path-based checker parses
    sparse indices, which it cannot read from a file. External tensors are emptied for it (`_check_external_data`
    has checked their files), so nothing is written beside the model: its folder may be read-only.
    """
    if any(_holds_external_data(tensor) for tensor in _sparse_tensors(model)):
        _check_as_onnxruntime_reads_it(model, path.absolute().parent)
        return
    try:
        onnx.checker.check_model(str(path))
    except UnicodeDecodeError:
        raise onnx.checker.ValidationError("a name or string of the model is not valid UTF-8") from None
    except onnx.checker.ValidationError:
        if not any(_is_default_domain_contrib_op(node) for node in model.graph.node) and not _undeclared(model):
            raise
        _check_as_onnxruntime_reads_it(model, path.absolute().parent)


def _is_default_domain_contrib_op(node: onnx.NodeProto) -> bool:
    return node.domain in DEFAULT_DOMAINS and node.op_type in ONNXRUNTIME_DEFAULT_DOMAIN_OPS


def _undeclared(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    """What onnxruntime infers and the checker wants declared: the shape of a tensor graph input, the type or shape
    of a graph output (an input without a type onnxruntime refuses too)."""
    inputs = [value for value in model.graph.input if value.type.HasField("tensor_type")]
    outputs = [value for value in model.graph.output if value.type.WhichOneof("value") in (None, "tensor_type")]
    return [value for value in (*inputs, *outputs) if not value.type.tensor_type.HasField("shape")]


def _check_as_onnxruntime_reads_it(model: onnx.ModelProto, folder: Path) -> None:
    remapped = onnx.ModelProto()
    remapped.CopyFrom(model)
    for value in _undeclared(remapped):
        # A placeholder for the structural check alone: it compares no types or shapes between nodes.
        if not value.type.tensor_type.elem_type:
            value.type.tensor_type.elem_type = onnx.TensorProto.FLOAT
        value.type.tensor_type.shape.SetInParent()
    for node in remapped.graph.node:
        if _is_default_domain_contrib_op(node):
            node.domain = ONNXRUNTIME_DOMAIN
    if all(opset.domain != ONNXRUNTIME_DOMAIN for opset in remapped.opset_import):
        remapped.opset_import.append(helper.make_opsetid(ONNXRUNTIME_DOMAIN, 1))
    for sparse in _sparse_tensors(remapped):
        # Emptied below, a sparse tensor's external part would no longer match its other part's count of values.
        if _holds_external_data(sparse):
            for part in (sparse.values, sparse.indices):
                if not external_data_helper.uses_external_data(part):
                    _empty(part)
    for tensor in external_tensors(remapped):
        location = {entry.key: entry.value for entry in tensor.external_data}.get("location", "")
        # The one external-data rule of the path-based checker that `_check_external_data` does not apply.
        if (folder / location).stat().st_nlink > 1:
            raise onnx.checker.ValidationError(
                f"Data of TensorProto ( tensor name: {tensor.name}) should be stored in {location}, but it has "
                "multiple hard links"
            )
        _empty(tensor)
    onnx.checker.check_model(remapped)


def _holds_external_data(sparse: onnx.SparseTensorProto) -> bool:
    return any(external_data_helper.uses_external_data(part) for part in (sparse.values, sparse.indices))


def _empty(tensor: onnx.TensorProto) -> None:
    """`tensor` with no elements, its name and type kept: what the structural check needs of it."""
    name, data_type = tensor.name, tensor.data_type
    tensor.Clear()
    tensor.name, tensor.data_type = name, data_type
    tensor.dims.append(0)


def is_trtfuse_model(path: Path) -> bool:
    """Whether the file at `path` is a model trtfuse wrote: it imports the trtfuse opset or holds a trtfuse node (a
    fused model), or carries trtfuse's metadata entry (one with nothing fused)."""
    model = onnx_model_at(path)
    if model is None:
        return False
    return (
        any(entry.key == WRITTEN_BY_KEY for entry in model.metadata_props)
        or any(opset.domain == contract.ONNX_DOMAIN for opset in model.opset_import)
        or any(node.domain == contract.ONNX_DOMAIN for node in model.graph.node)
    )


def _stamped_bytes(model: onnx.ModelProto) -> bytes:
    """`model` serialised, with trtfuse's metadata entry where it imports no trtfuse opset and lacks the entry; the
    proto itself unchanged (a serialised message followed by another parses as their merge, repeated fields
    appended)."""
    data = model.SerializeToString()
    domains = {opset.domain for opset in model.opset_import}
    if contract.ONNX_DOMAIN in domains or any(entry.key == WRITTEN_BY_KEY for entry in model.metadata_props):
        return data
    stamp = onnx.ModelProto()
    stamp.metadata_props.add(key=WRITTEN_BY_KEY, value=__version__)
    return data + stamp.SerializeToString()


def data_copies(model: onnx.ModelProto, path: Path, source: LoadedModel | None) -> list[Path]:
    """The external data files `save_model(model, path, source)` will write: none when `path` is in the source's
    folder, else one copy per data file the model still references."""
    folder = Path(path).absolute().parent
    if source is None or resolved(source.path.absolute().parent) == resolved(folder):
        return []
    return [folder / location for location in _locations(model, Path(path))]


def _locations(model: onnx.ModelProto, path: Path) -> list[str]:
    return sorted({_external_ref(tensor, path).location for tensor in external_tensors(model)})


def save_model(
    model: onnx.ModelProto,
    path: str | os.PathLike,
    source: LoadedModel | None = None,
    notify: Callable[[str], None] | None = None,
) -> None:
    """Write `model` atomically to `path`, recognisably trtfuse's (`is_trtfuse_model`: its trtfuse opset, else a
    metadata entry added to the file, `model` itself left as it is); tensors that reference external data keep it.

    External locations are relative to `source.path`'s folder (or `path`'s when there is no source). When `path` is in
    another folder, the data files the model still references are copied there (`notify` hears of each copy); a file
    of that name already there is kept when it holds the same bytes, else the save is refused. The written file must
    pass the ONNX checker. Inside a `Transaction`, a later failure of the call removes what this wrote.
    """
    path = Path(path)
    check_writable(path)
    if model.ByteSize() > MAX_PROTO_BYTES:
        raise TrtfuseError(f"{path}: model is over 2 GiB without its external data; keep large tensors external")
    source_folder = source.path.absolute().parent if source is not None else None
    with contextlib.ExitStack() as stack:
        # Without a transaction of the caller's, this save is its own: a failure removes the copies it made.
        if Transaction.active() is None:
            stack.enter_context(Transaction())
        for target in data_copies(model, path, source):
            _place_data_file(source_folder / target.relative_to(path.absolute().parent), target, notify)
        _write_checked(model, path)


def _place_data_file(source: Path, target: Path, notify: Callable[[str], None] | None) -> None:
    """Make `target` a copy of `source` unless it already holds the same bytes; any other file is never overwritten.

    A copy, not a hard link: onnx (1.17 and later) refuses to read external data files with several links, so a link
    would break both the output and the source model.
    """
    if not source.is_file():
        raise TrtfuseError(f"{source}: external data file is missing")
    if target.exists():
        if target.is_file() and (os.path.samefile(source, target) or same_content(source, target)):
            return
        raise TrtfuseError(
            f"{target}: exists and is not a copy of the external data {source}; write the output to another folder"
        )
    make_folders(target.parent)
    copy_sparse(source, target, notify)


def _write_checked(model: onnx.ModelProto, path: Path) -> None:
    with atomic_file(path) as temp:
        temp.write_bytes(_stamped_bytes(model))
        try:
            check_model_file(temp, model)
        except onnx.checker.ValidationError as error:
            # The models saved are trtfuse's results from checked inputs: one the checker refuses is trtfuse's bug.
            raise RuntimeError(f"{path}: the model written fails the ONNX checker: {first_line(error)}") from None
