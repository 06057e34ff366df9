"""AOT plugins: every op of the contract as a tensorrt.plugin definition (QDP) whose kernels TensorRT embeds in the
engine and launches itself, so that the engine runs without Python (docs/plugins.md, "AOT plugins").

Each QDP is three plain functions that `qdp_definitions` builds from tensorrt.plugin's types and
`register_definitions` alone hands to its decorators: the output shapes and dtypes (`@trtp.register`), the
type/format/tactic combinations (`@trtp.autotune`) and, per chosen combination and tactic, the compiled kernel with
its launch (`@trtp.aot_impl`). tensorrt.plugin validates them with `inspect.signature` and calls them positionally:
inputs, then every field in the op's field order (`contract.FusedOp.fields`, named as the contract names them), then
`outputs` (and `tactic`); the contract's codec decodes the field bytes (`codec.from_qdp`). This module therefore has
no `from __future__ import annotations`, which would turn the annotations it checks into strings; and the signatures
can be read without TensorRT by passing stand-in types to `qdp_definitions`.

Importing this module needs neither TensorRT nor CuTeDSL: the kernels are imported when TensorRT calls autotune or
aot_impl during a build. `plugins.registry.register_aot` is what registers them.
"""

import functools
import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from trtfuse import contract
from trtfuse.contract.codec import NodeFields, from_qdp
from trtfuse.errors import TrtfuseError
from trtfuse.plugins.trt_module import contract_data_types, load_trt

LINEAR = "LINEAR"
# Every field is annotated `bytes`: tensorrt.plugin makes its value as `bytes(field.data)`, the raw bytes of the
# one-element FLOAT32 or INT32 array the ONNX parser sends (its type is the attribute's, whatever the creator
# advertises), read back by the codec. `float`/`int` annotations make it `float(field.data)` on a one-element
# array, which NumPy >= 2.4 refuses; `numpy.typing.NDArray` ones fail tensorrt.plugin's `issubclass` checks on
# NumPy >= 2.5 and Python >= 3.13 (_lib.py create_plugin, _validate.py, v10.9.0 to v11.1; docs/plugins.md).
Float32Field = bytes
Int32Field = bytes
# tensorrt.plugin's spelling of each contract dtype in AutoTuneCombination type strings.
COMBINATION_TYPE_NAMES = {"float32": "FP32", "float16": "FP16", "bfloat16": "BF16"}

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
    return _rms_norm(trtp), _qk_norm(trtp), _add_rms_norm(trtp)


def _rms_norm(trtp: Any) -> QdpDefinition:
    TensorDesc = trtp.TensorDesc
    Kernel = tuple[str, str, trtp.KernelLaunchParams, trtp.SymIntExprs]

    def register(
        x: TensorDesc,
        weight: TensorDesc,
        epsilon: Float32Field,
        weight_offset: Float32Field,
        weight_mode: Int32Field,
        hidden_size: Int32Field,
        output_dtype: Int32Field,
    ) -> TensorDesc:
        fields = from_qdp(contract.RMS_NORM, (epsilon, weight_offset, weight_mode, hidden_size, output_dtype))
        return _output_like(x, fields)

    def autotune(
        x: TensorDesc,
        weight: TensorDesc,
        epsilon: Float32Field,
        weight_offset: Float32Field,
        weight_mode: Int32Field,
        hidden_size: Int32Field,
        output_dtype: Int32Field,
        outputs: tuple[TensorDesc],
    ) -> list[trtp.AutoTuneCombination]:
        fields = from_qdp(contract.RMS_NORM, (epsilon, weight_offset, weight_mode, hidden_size, output_dtype))
        return _one_part_combinations(trtp, contract.RMS_NORM, fields)

    def aot_impl(
        x: TensorDesc,
        weight: TensorDesc,
        epsilon: Float32Field,
        weight_offset: Float32Field,
        weight_mode: Int32Field,
        hidden_size: Int32Field,
        output_dtype: Int32Field,
        outputs: tuple[TensorDesc],
        tactic: int,
    ) -> Kernel:
        fields = from_qdp(contract.RMS_NORM, (epsilon, weight_offset, weight_mode, hidden_size, output_dtype))
        return _one_part_kernel(trtp, contract.RMS_NORM, fields, x, weight, outputs[0], tactic)

    return QdpDefinition(contract.RMS_NORM_OP, register, autotune, aot_impl)


def _qk_norm(trtp: Any) -> QdpDefinition:
    TensorDesc = trtp.TensorDesc
    Kernel = tuple[str, str, trtp.KernelLaunchParams, trtp.SymIntExprs]

    def register(
        q: TensorDesc,
        k: TensorDesc,
        q_weight: TensorDesc,
        k_weight: TensorDesc,
        epsilon: Float32Field,
        weight_offset: Float32Field,
        weight_mode: Int32Field,
        q_hidden_size: Int32Field,
        k_hidden_size: Int32Field,
        output_dtype: Int32Field,
    ) -> tuple[TensorDesc, TensorDesc]:
        raw = (epsilon, weight_offset, weight_mode, q_hidden_size, k_hidden_size, output_dtype)
        fields = from_qdp(contract.QK_NORM, raw)
        return _output_like(q, fields), _output_like(k, fields)

    def autotune(
        q: TensorDesc,
        k: TensorDesc,
        q_weight: TensorDesc,
        k_weight: TensorDesc,
        epsilon: Float32Field,
        weight_offset: Float32Field,
        weight_mode: Int32Field,
        q_hidden_size: Int32Field,
        k_hidden_size: Int32Field,
        output_dtype: Int32Field,
        outputs: tuple[TensorDesc, TensorDesc],
    ) -> list[trtp.AutoTuneCombination]:
        from trtfuse.kernels.artifacts import qk_norm_tactics
        from trtfuse.kernels.specs import QkNormSpec

        raw = (epsilon, weight_offset, weight_mode, q_hidden_size, k_hidden_size, output_dtype)
        fields = from_qdp(contract.QK_NORM, raw)
        params, out_dtype, (q_hidden, k_hidden) = fields.params, fields.output_dtype, fields.hidden_sizes
        combinations = []
        for dtype, weight_dtype in _dtype_choices(fields):
            spec_weight = _spec_weight_dtype(fields, weight_dtype)
            spec = QkNormSpec(q_hidden, k_hidden, dtype, spec_weight, params, out_dtype)
            types = (dtype, dtype, weight_dtype, weight_dtype, out_dtype, out_dtype)
            combinations.append(_combination(trtp, types, qk_norm_tactics(spec)))
        return combinations

    def aot_impl(
        q: TensorDesc,
        k: TensorDesc,
        q_weight: TensorDesc,
        k_weight: TensorDesc,
        epsilon: Float32Field,
        weight_offset: Float32Field,
        weight_mode: Int32Field,
        q_hidden_size: Int32Field,
        k_hidden_size: Int32Field,
        output_dtype: Int32Field,
        outputs: tuple[TensorDesc, TensorDesc],
        tactic: int,
    ) -> Kernel:
        from trtfuse.kernels.artifacts import qk_norm_artifact
        from trtfuse.kernels.declaration import Tactic
        from trtfuse.kernels.specs import QkNormSpec

        raw = (epsilon, weight_offset, weight_mode, q_hidden_size, k_hidden_size, output_dtype)
        fields = from_qdp(contract.QK_NORM, raw)
        spec = QkNormSpec(
            q_hidden=fields.hidden_sizes[0],
            k_hidden=fields.hidden_sizes[1],
            dtype=_dtype_name(q.dtype),
            weight_dtype=_spec_weight_dtype(fields, _dtype_name(q_weight.dtype)),
            params=fields.params,
            out_dtype=_dtype_name(outputs[0].dtype),
        )
        return _kernel(trtp, qk_norm_artifact(spec, Tactic(tactic), _build_arch()), (q, k))

    return QdpDefinition(contract.QK_NORM_OP, register, autotune, aot_impl)


def _add_rms_norm(trtp: Any) -> QdpDefinition:
    TensorDesc = trtp.TensorDesc
    Kernel = tuple[str, str, trtp.KernelLaunchParams, trtp.SymIntExprs]

    def register(
        x: TensorDesc,
        residual: TensorDesc,
        weight: TensorDesc,
        epsilon: Float32Field,
        weight_offset: Float32Field,
        weight_mode: Int32Field,
        hidden_size: Int32Field,
        output_dtype: Int32Field,
    ) -> tuple[TensorDesc, TensorDesc]:
        fields = from_qdp(contract.ADD_RMS_NORM, (epsilon, weight_offset, weight_mode, hidden_size, output_dtype))
        # y in output_dtype; h, the residual stream's next value, keeps x's shape and dtype.
        return _output_like(x, fields), x.like()

    def autotune(
        x: TensorDesc,
        residual: TensorDesc,
        weight: TensorDesc,
        epsilon: Float32Field,
        weight_offset: Float32Field,
        weight_mode: Int32Field,
        hidden_size: Int32Field,
        output_dtype: Int32Field,
        outputs: tuple[TensorDesc, TensorDesc],
    ) -> list[trtp.AutoTuneCombination]:
        fields = from_qdp(contract.ADD_RMS_NORM, (epsilon, weight_offset, weight_mode, hidden_size, output_dtype))
        return _one_part_combinations(trtp, contract.ADD_RMS_NORM, fields)

    def aot_impl(
        x: TensorDesc,
        residual: TensorDesc,
        weight: TensorDesc,
        epsilon: Float32Field,
        weight_offset: Float32Field,
        weight_mode: Int32Field,
        hidden_size: Int32Field,
        output_dtype: Int32Field,
        outputs: tuple[TensorDesc, TensorDesc],
        tactic: int,
    ) -> Kernel:
        fields = from_qdp(contract.ADD_RMS_NORM, (epsilon, weight_offset, weight_mode, hidden_size, output_dtype))
        # One part: the grid and the row count are x's (the residual has x's shape).
        return _one_part_kernel(trtp, contract.ADD_RMS_NORM, fields, x, weight, outputs[0], tactic)

    return QdpDefinition(contract.ADD_RMS_NORM_OP, register, autotune, aot_impl)


# --- what every QDP shares -----------------------------------------------------------------------------------------


def _one_part_kernels(op: contract.FusedOp) -> tuple[Any, Callable[..., Any], Callable[..., Any]]:
    """The spec class, artifact builder and tactics of a one-part op's kernels."""
    from trtfuse.kernels import artifacts, specs

    if op is contract.RMS_NORM:
        return specs.RmsNormSpec, artifacts.rms_norm_artifact, artifacts.rms_norm_tactics
    return specs.AddRmsNormSpec, artifacts.add_rms_norm_artifact, artifacts.add_rms_norm_tactics


def _one_part_combinations(trtp: Any, op: contract.FusedOp, fields: NodeFields) -> list[Any]:
    """autotune of a one-part op: every (activation, weight) dtype pair for the output dtype, in the op's tensor
    order (activations share D; normalised outputs are in output_dtype, the others in D), with the spec's tactics."""
    spec_class, _artifact, tactics = _one_part_kernels(op)
    params, out_dtype, (hidden,) = fields.params, fields.output_dtype, fields.hidden_sizes
    combinations = []
    for dtype, weight_dtype in _dtype_choices(fields):
        spec = spec_class(hidden, dtype, _spec_weight_dtype(fields, weight_dtype), params, out_dtype)
        outputs = tuple(out_dtype if normalised else dtype for normalised in op.normalised_outputs)
        types = (*(dtype for _ in op.activations), weight_dtype, *outputs)
        combinations.append(_combination(trtp, types, tactics(spec)))
    return combinations


def _one_part_kernel(
    trtp: Any, op: contract.FusedOp, fields: NodeFields, x: Any, weight: Any, y: Any, tactic: int
) -> tuple[str, str, Any, Any]:
    """aot_impl of a one-part op: the artifact of the dtypes TensorRT chose, launched over x's rows."""
    from trtfuse.kernels.declaration import Tactic

    spec_class, artifact, _tactics = _one_part_kernels(op)
    spec = spec_class(
        hidden=fields.hidden_sizes[0],
        dtype=_dtype_name(x.dtype),
        weight_dtype=_spec_weight_dtype(fields, _dtype_name(weight.dtype)),
        params=fields.params,
        out_dtype=_dtype_name(y.dtype),
    )
    return _kernel(trtp, artifact(spec, Tactic(tactic), _build_arch()), (x,))


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
    return contract_data_types(load_trt())


def _dtype_name(data_type: Any) -> str:
    for name, known in _data_types().items():
        if known == data_type:
            return name
    raise TrtfuseError(f"the trtfuse AOT kernels take float32, float16 or bfloat16 tensors, not {data_type}")


def _output_like(activation: Any, fields: NodeFields) -> Any:
    """A descriptor with `activation`'s shape expression and the node's output dtype."""
    output = activation.like()
    output.dtype = _data_types()[fields.output_dtype]
    return output


def _build_arch() -> str:
    """The architecture of the GPU TensorRT builds on (the current CUDA context's): the PTX is compiled for it."""
    from trtfuse.kernels.device import current_device

    return current_device().arch


def _kernel(trtp: Any, artifact: Any, activations: Sequence[Any]) -> tuple[str, str, Any, Any]:
    """aot_impl's result for `artifact`: its entry name, its PTX, and its launch as expressions of the activations'
    symbolic shapes (rows = element count // hidden), by the declaration's own formula.

    Refused when this machine's driver cannot JIT the PTX (CuTeDSL built against a newer CUDA than the driver):
    TensorRT would fail to time it with a bare CUDA error."""
    from trtfuse.kernels.device import driver_version, ptx_driver_problem, ptx_isa

    problem = ptx_driver_problem(artifact.ptx, driver_version())
    if problem is not None:
        raise TrtfuseError(f"{problem}: update the driver, or build with the Python plugins")
    _embedded_ptx_isas.add(ptx_isa(artifact.ptx))
    declaration = artifact.declaration
    rows = declaration.rows_of([activation.shape_expr.numel() for activation in activations])
    grid_x, scalars = declaration.launch_values(rows, trtp.cdiv, lambda blocks: trtp.max(blocks, 1))
    launch = trtp.KernelLaunchParams()
    launch.grid_x = grid_x
    launch.block_x = declaration.block_threads
    launch.shared_mem = declaration.shared_mem
    extra_args = trtp.SymIntExprs.from_tuple([trtp.SymInt32(scalar) for scalar in scalars])
    return declaration.kernel_name, artifact.ptx, launch, extra_args
