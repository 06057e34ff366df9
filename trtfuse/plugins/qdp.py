"""AOT plugins: every op of the contract as a tensorrt.plugin definition (QDP) whose kernels TensorRT embeds in the
engine and launches itself, so that the engine runs without Python (docs/plugins.md, "AOT plugins").

Each QDP is three functions that `qdp_definitions` builds from the op's table (`contract.OPS`) and tensorrt.plugin's
types, and `register_definitions` alone hands to its decorators: the output shapes and dtypes (`@trtp.register`), the
type/format/tactic combinations (`@trtp.autotune`) and, per chosen combination and tactic, the compiled kernel with
its launch (`@trtp.aot_impl`). Their signatures are `inspect.Signature`s made from the op's inputs and fields
(`qdp_signatures`), set as the functions' `__signature__`, which is all tensorrt.plugin reads of them: inputs, then
every field in the op's field order (`contract.FusedOp.fields`, named as the contract names them), then `outputs`
(and `tactic`); the contract's codec decodes the field bytes (`codec.from_qdp`). The signatures can be read without
TensorRT by passing stand-in types to `qdp_definitions`.

Importing this module needs neither TensorRT nor CuTeDSL: the kernels are imported when TensorRT calls autotune or
aot_impl during a build. `plugins.registry.register_aot` is what registers them.
"""

from __future__ import annotations

import functools
import importlib
import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from trtfuse import contract
from trtfuse.contract.codec import NodeFields, from_qdp
from trtfuse.contract.rotary_shapes import output_dims
from trtfuse.errors import TrtfuseError
from trtfuse.plugins.kernel_specs import kernel_names, kernel_spec
from trtfuse.plugins.trt_module import contract_data_types, load_trt, quant_data_types

LINEAR = "LINEAR"
# Every field is annotated `bytes`: tensorrt.plugin makes its value as `bytes(field.data)`, the raw bytes of the
# one-element FLOAT32 or INT32 array the ONNX parser sends (its type is the attribute's, whatever the creator
# advertises), read back by the codec. `float`/`int` annotations make it `float(field.data)` on a one-element
# array, which NumPy >= 2.4 refuses; `numpy.typing.NDArray` ones fail tensorrt.plugin's `issubclass` checks on
# NumPy >= 2.5 and Python >= 3.13 (_lib.py create_plugin, _validate.py, v10.9.0 to v11.1; docs/plugins.md).
FIELD_ANNOTATION = bytes
_POSITIONAL = inspect.Parameter.POSITIONAL_OR_KEYWORD
# tensorrt.plugin's spelling of each contract dtype in AutoTuneCombination type strings: "FP32" and "FP16", else the
# trt.DataType member's name (`_str_to_data_type`, P/_utils.py:40-48 at v10.9.0 and v11.1): BF16, and FP8 and INT8
# for a quantized op's normalised outputs.
COMBINATION_TYPE_NAMES = {
    "float32": "FP32",
    "float16": "FP16",
    "bfloat16": "BF16",
    "float8_e4m3fn": "FP8",
    "int8": "INT8",
}

# The PTX ISA of every kernel handed to TensorRT in this process: the sidecar records it, since the CUDA driver that
# runs the engine must know it.
_embedded_ptx_isas: set[str] = set()


@dataclass(frozen=True)
class QdpDefinition:
    """The functions of one QDP, before tensorrt.plugin's decorators see them."""

    op: str
    register: Callable[..., Any]
    autotune: Callable[..., Any]
    aot_impl: Callable[..., Any]

    @property
    def plugin_id(self) -> str:
        """tensorrt.plugin's "namespace::name"; the parser looks the plugin up by op_type and plugin_namespace."""
        return f"{contract.PLUGIN_NAMESPACE}::{self.op}"


def take_embedded_ptx_isas() -> list[str]:
    """The PTX ISA versions of the kernels handed to TensorRT since the last call, oldest first."""
    taken = sorted(_embedded_ptx_isas, key=lambda isa: tuple(int(part) for part in isa.split(".")))
    _embedded_ptx_isas.clear()
    return taken


def register_definitions(trt: ModuleType) -> None:
    """Apply tensorrt.plugin's decorators to every op's QDP functions (`registry.register_aot` calls it once)."""
    trtp = importlib.import_module(f"{trt.__name__}.plugin")
    for definition in qdp_definitions(trtp):
        trtp.register(definition.plugin_id)(definition.register)
        trtp.autotune(definition.plugin_id)(definition.autotune)
        trtp.aot_impl(definition.plugin_id)(definition.aot_impl)


def qdp_definitions(trtp: Any) -> tuple[QdpDefinition, ...]:
    """Every op's QDP, in `contract.FUSED_OPS` order, their signatures annotated with `trtp`'s TensorDesc,
    AutoTuneCombination, KernelLaunchParams and SymIntExprs (tensorrt.plugin's, or stand-ins to read the signatures
    without TensorRT)."""
    return tuple(_definition(trtp, op) for op in contract.OPS.values())


def _definition(trtp: Any, op: contract.FusedOp) -> QdpDefinition:
    """One op's three functions, their signatures made from the op's table (`qdp_signatures`)."""
    register, autotune, aot_impl = qdp_signatures(trtp, op)

    def outputs_of(arguments: dict[str, Any]) -> Any:
        fields = _fields_of(op, arguments)
        descs = tuple(_output_desc(trtp, op, index, arguments, fields) for index in range(len(op.outputs)))
        return descs[0] if len(descs) == 1 else descs

    def combinations_of(arguments: dict[str, Any]) -> list[Any]:
        return _combinations(trtp, op, _fields_of(op, arguments))

    def kernel_of(arguments: dict[str, Any]) -> tuple[str, str, Any, Any]:
        inputs = [arguments[name] for name in op.inputs(True)]
        return _aot_kernel(trtp, op, _fields_of(op, arguments), inputs, arguments["outputs"], arguments["tactic"])

    return QdpDefinition(
        op.name,
        _qdp_function(op, "register", register, outputs_of),
        _qdp_function(op, "autotune", autotune, combinations_of),
        _qdp_function(op, "aot_impl", aot_impl, kernel_of),
    )


def qdp_signatures(trtp: Any, op: contract.FusedOp) -> tuple[inspect.Signature, inspect.Signature, inspect.Signature]:
    """The register, autotune and aot_impl signatures of `op`'s QDP: its inputs (a weight always, as AOT nodes carry
    a placeholder for NONE) as TensorDescs, then every field in the op's order as `bytes`, then `outputs` (and
    `tactic`), all positional-or-keyword without defaults; the return annotations tensorrt.plugin checks."""
    tensor_desc = trtp.TensorDesc
    tensors = [inspect.Parameter(name, _POSITIONAL, annotation=tensor_desc) for name in op.inputs(True)]
    fields = [inspect.Parameter(name, _POSITIONAL, annotation=FIELD_ANNOTATION) for name in op.fields]
    output_descs = tuple[(tensor_desc,) * len(op.outputs)]
    outputs = inspect.Parameter("outputs", _POSITIONAL, annotation=output_descs)
    tactic = inspect.Parameter("tactic", _POSITIONAL, annotation=int)
    kernel = tuple[str, str, trtp.KernelLaunchParams, trtp.SymIntExprs]
    return (
        inspect.Signature([*tensors, *fields], return_annotation=tensor_desc if len(op.outputs) == 1 else output_descs),
        inspect.Signature([*tensors, *fields, outputs], return_annotation=list[trtp.AutoTuneCombination]),
        inspect.Signature([*tensors, *fields, outputs, tactic], return_annotation=kernel),
    )


def _qdp_function(
    op: contract.FusedOp, role: str, signature: inspect.Signature, body: Callable[[dict[str, Any]], Any]
) -> Callable[..., Any]:
    """A function tensorrt.plugin reads as having `signature`: it reads a QDP function's parameters and annotations
    only through `inspect.signature` (P/_validate.py:89, 172, 208, 285, 399 at v10.9.0 and v11.1; nothing in P reads
    `__annotations__`, `__code__` or type hints), which returns a callable's `__signature__` when it has one
    (CPython Lib/inspect.py, `_signature_from_callable`, since 3.3). It calls them as
    `register_function(*input_descs, **self.attrs)` (P/_plugin_class.py:69, 131; v10.9.0: 67, 137) and
    `autotune_function(*input_descs, *val, output_descs)` / `aot_impl_function(*input_descs, *val, output_descs,
    tactic)` (:176, 402; v10.9.0: 185, 418): binding the call to the signature gives `body` every argument by name,
    however it was passed."""

    def qdp_function(*args: Any, **kwargs: Any) -> Any:
        return body(dict(signature.bind(*args, **kwargs).arguments))

    qdp_function.__signature__ = signature  # type: ignore[attr-defined]
    qdp_function.__name__ = qdp_function.__qualname__ = f"{op.name}_{role}"
    return qdp_function


def _fields_of(op: contract.FusedOp, arguments: dict[str, Any]) -> NodeFields:
    return from_qdp(op, [arguments[name] for name in op.fields])


def _output_desc(trtp: Any, op: contract.FusedOp, index: int, arguments: dict[str, Any], fields: NodeFields) -> Any:
    """Output `index`: its part's first activation's shape (its [B, H, S, D] where a rotary node moves heads,
    `contract.rotary_shapes.output_dims`), in the normalised dtype if it is normalised (y in `output_dtype` or the
    output quantizer's FP8 / INT8), else in that activation's dtype (the add-norm's h)."""
    part = op.output_parts[index]
    source = arguments[op.activations[op.activation_parts.index(part)]]
    output = source.like()
    if fields.rotary is not None and fields.rotary.moves_heads:
        dims = output_dims(fields.rotary, fields.hidden_sizes[part], list(source.shape_expr))
        output.shape_expr = trtp.ShapeExprs.from_tuple(tuple(dims))
    if op.normalised_outputs[index]:
        output.dtype = _data_types()[fields.normalised_dtype(index)]
    return output


def _kernel_functions(op: contract.FusedOp) -> tuple[Callable[..., Any], Callable[..., Any]]:
    """The artifact builder and tactics of the kernels of `op` (a quantized op's are its plain op's)."""
    from trtfuse.kernels import artifacts

    names = kernel_names(op)
    return getattr(artifacts, names.artifact), getattr(artifacts, names.tactics)


def _spec(fields: NodeFields, dtype: str, weight_dtype: str, table_dtype: str | None = None) -> Any:
    """The node's kernel spec for one (activation, weight input) dtype pair (no weight dtype for weight_mode NONE,
    whose kernel never reads the placeholder), and a rotary op's table dtype."""
    return kernel_spec(fields, dtype, _spec_weight_dtype(fields, weight_dtype), table_dtype)


def _combinations(trtp: Any, op: contract.FusedOp, fields: NodeFields) -> list[Any]:
    """autotune: every (activation, weight) dtype pair the kernels take for the node's output dtype (and, for a
    rotary op, each table dtype: float32 or the activations'), in the op's tensor order (activations share D,
    weights one dtype, tables one; normalised outputs in the normalised dtype, the others in D), each with its
    spec's tactics."""
    _artifact, tactics = _kernel_functions(op)
    combinations = []
    for dtype, weight_dtype in _dtype_choices(fields):
        for table_dtype in _table_dtypes(op, dtype):
            tables = (table_dtype for _ in op.rotary_tables)
            types = (
                *(dtype for _ in op.activations),
                *(weight_dtype for _ in op.weights),
                *tables,
                *fields.output_dtypes(dtype),
            )
            spec = _spec(fields, dtype, weight_dtype, table_dtype)
            combinations.append(_combination(trtp, types, tactics(spec)))
    return combinations


def _table_dtypes(op: contract.FusedOp, dtype: str) -> list[str | None]:
    """A rotary op's table dtypes for activations of `dtype` (float32, or theirs); [None] for another op."""
    return list(dict.fromkeys(("float32", dtype))) if op.rotary else [None]


def _aot_kernel(
    trtp: Any, op: contract.FusedOp, fields: NodeFields, inputs: Sequence[Any], outputs: Sequence[Any], tactic: int
) -> tuple[str, str, Any, Any]:
    """aot_impl: the artifact of the dtypes TensorRT chose, launched over the rows of each part's first activation
    (q, then k; the add-norm's x, whose residual has its shape)."""
    from trtfuse.kernels.declaration import Tactic

    artifact, _tactics = _kernel_functions(op)
    for index, (name, desc, normalised) in enumerate(zip(op.outputs, outputs, op.normalised_outputs, strict=True)):
        chosen, wanted = _dtype_name(desc.dtype), fields.normalised_dtype(index)
        if normalised and chosen != wanted:
            raise TrtfuseError(f"{op.name}: TensorRT chose {chosen} for '{name}', which is {wanted}")
    dtype = _dtype_name(inputs[0].dtype)
    table_dtype = _dtype_name(inputs[-1].dtype) if op.rotary else None
    spec = _spec(fields, dtype, _dtype_name(inputs[len(op.activations)].dtype), table_dtype)
    activations = [inputs[op.activation_parts.index(part)] for part in range(len(op.weights))]
    built = artifact(spec, Tactic(tactic), _build_arch())
    extents = ()
    if op.rotary:
        named = dict(zip(op.inputs(True), inputs, strict=True))
        extents = tuple(named[extent.tensor].shape_expr[extent.axis] for extent in built.declaration.extents)
    return _kernel(trtp, built, activations, extents)


def _dtype_choices(fields: NodeFields) -> list[tuple[str, str]]:
    """(activation dtype, weight input dtype) pairs the kernels take for the node's output dtype: every activation
    dtype that pairs with it, with every weight dtype, or with the placeholder's alone when weight_mode is NONE."""
    weights = contract.WEIGHT_DTYPES if fields.has_weight else (contract.AOT_PLACEHOLDER_WEIGHT_DTYPE,)
    return [
        (dtype, weight_dtype)
        for dtype in contract.ACTIVATION_DTYPES
        if contract.dtype_pair_problem(dtype, fields.output_dtype) is None
        for weight_dtype in weights
    ]


def _spec_weight_dtype(fields: NodeFields, weight_dtype: str) -> str | None:
    """The kernel spec's weight dtype: none for weight_mode NONE, whose kernel never reads the placeholder."""
    return weight_dtype if fields.has_weight else None


def _combination(trtp: Any, io_dtypes: Sequence[str], tactics: Sequence[int]) -> Any:
    """One fixed type combination (inputs then outputs), LINEAR throughout, with the spec's tactics."""
    types = ", ".join(COMBINATION_TYPE_NAMES[dtype] for dtype in io_dtypes)
    return trtp.AutoTuneCombination(types, LINEAR, [int(tactic) for tactic in tactics])


@functools.cache
def _data_types() -> dict[str, Any]:
    """Every dtype a trtfuse QDP tensor may have, by contract name: the float dtypes, and a quantized output's."""
    trt = load_trt()
    return {**contract_data_types(trt), **quant_data_types(trt)}


def _dtype_name(data_type: Any) -> str:
    for name, known in _data_types().items():
        if known == data_type:
            return name
    raise TrtfuseError(
        f"the trtfuse AOT kernels take float32, float16 or bfloat16 tensors (FP8 or INT8 normalised outputs), "
        f"not {data_type}"
    )


def _build_arch() -> str:
    """The architecture of the GPU TensorRT builds on (the current CUDA context's): the PTX is compiled for it."""
    from trtfuse.kernels.device import current_device

    return current_device().arch


def _kernel(
    trtp: Any, artifact: Any, activations: Sequence[Any], extents: Sequence[Any] = ()
) -> tuple[str, str, Any, Any]:
    """aot_impl's result for `artifact`: its entry name, its PTX, and its launch as expressions of the activations'
    symbolic shapes (rows = element count // hidden) and, for a rotary op, of the dims its declaration reads off its
    inputs (`extents`: q's batch, the tokens, the tables' batch), by the declaration's own formula.

    Refused when this machine's driver cannot JIT the PTX (CuTeDSL built against a newer CUDA than the driver):
    TensorRT would fail to time it with a bare CUDA error."""
    from trtfuse.kernels.device import driver_version, ptx_driver_problem, ptx_isa

    problem = ptx_driver_problem(artifact.ptx, driver_version())
    if problem is not None:
        raise TrtfuseError(f"{problem}: update the driver, or build with the Python plugins")
    _embedded_ptx_isas.add(ptx_isa(artifact.ptx))
    declaration = artifact.declaration
    rows = declaration.rows_of([activation.shape_expr.numel() for activation in activations])
    formula = (rows, trtp.cdiv, lambda blocks: trtp.max(blocks, 1))
    # Only the rotary kernel's declaration reads extents; the others' take none.
    grid_x, scalars = declaration.launch_values(*formula, extents) if extents else declaration.launch_values(*formula)
    launch = trtp.KernelLaunchParams()
    launch.grid_x = grid_x
    launch.block_x = declaration.block_threads
    launch.shared_mem = declaration.shared_mem
    extra_args = trtp.SymIntExprs.from_tuple([trtp.SymInt32(scalar) for scalar in scalars])
    return declaration.kernel_name, artifact.ptx, launch, extra_args
