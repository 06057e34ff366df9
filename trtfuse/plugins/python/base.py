"""What the plugins share: TensorRT's IPluginV3 lifecycle around one cached norm kernel, for any op of the contract.

A plugin's tensors are its op's (`contract.FusedOp`): the activations, then (unless weight_mode is NONE) one weight
per part, then a rotary op's cos and sin tables; the activations of one part (the add-norm's x and residual) share
one shape, and each output has the shape of its part's first activation. The tables ([Bc, S, R], float32 or the
activations' dtype, one dtype for both) give the launch its extents: q's batch, the tokens, the tables' batch
(`contract.rotary_shapes`). Every activation shares one dtype (fp32, fp16 or bf16), every weight one dtype of its own;
normalised outputs are in the node's normalised dtype (`NodeFields.normalised_dtype`: `output_dtype`, or a
quantized op's FP8 / INT8 where the output's stage is on), the others in the activations' dtype; all tensors are
LINEAR. Leading dims are flattened into rows of the part's hidden size. A quantized op (`contract.quantized`) runs
in its plain op's class with the op swapped (`plugins.python.creators`): the same tensors and launch, its
quantizers in the kernel spec.

Work is done where TensorRT allows time for it: `configure_plugin` (build) and `on_shape_change` (build and run)
pick the kernel and warm it up for every row count up to the largest seen, so `enqueue` is one call of a bound
method with plain ints: no allocation, no synchronisation, no compilation, capturable in a CUDA graph.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from types import ModuleType
from typing import Any, ClassVar

import trtfuse
from trtfuse.contract import PLUGIN_NAMESPACE, PLUGIN_VERSION, FusedOp, dtype_pair_problem
from trtfuse.contract.codec import NodeFields
from trtfuse.contract.rotary_shapes import output_dims, rotary_extents
from trtfuse.errors import MissingDependencyError, TrtfuseError
from trtfuse.plugins.creation_errors import record_creation_error
from trtfuse.plugins.kernel_specs import kernel_names, kernel_spec
from trtfuse.plugins.python.fields import advertised_fields, parse_fields, serialize_fields
from trtfuse.plugins.trt_module import contract_data_types, load_trt, quant_data_types

trt = load_trt()

# Activations and weights take the float dtypes; only a normalised output may also take a quantized one.
_DATA_TYPES = contract_data_types(trt)
DTYPE_NAMES = {data_type: name for name, data_type in _DATA_TYPES.items()}
OUTPUT_DATA_TYPES = {**_DATA_TYPES, **quant_data_types(trt)}
OUTPUT_DTYPE_NAMES = {data_type: name for name, data_type in OUTPUT_DATA_TYPES.items()}
# With no custom tactics advertised (no get_valid_tactics), TensorRT passes set_tactic this one, the default.
DEFAULT_TACTIC = 0


def timing_cache_id(config: NodeFields) -> str:
    """TensorRT reuses a plugin's timings across nodes with equal IDs, so the ID names everything the kernel is
    compiled for (the repr holds every field, floats exactly) and the trtfuse version that compiled it."""
    return f"trtfuse {trtfuse.__version__} {config!r}"


class NormPlugin(trt.IPluginV3, trt.IPluginV3OneCore, trt.IPluginV3OneBuild, trt.IPluginV3OneRuntime):
    """One fused norm node. Subclasses name the op (`OP`); the kernel, its spec and its launch follow from the op's
    tables (`plugins.kernel_specs`, `launch_args`)."""

    OP: ClassVar[FusedOp]

    def __init__(self, config: NodeFields, phase: Any, node: str = "") -> None:
        trt.IPluginV3.__init__(self)
        trt.IPluginV3OneCore.__init__(self)
        trt.IPluginV3OneBuild.__init__(self)
        trt.IPluginV3OneRuntime.__init__(self)
        self.plugin_name = self.OP.name
        self.plugin_namespace = PLUGIN_NAMESPACE
        self.plugin_version = PLUGIN_VERSION
        self.num_outputs = len(self.OP.outputs)
        self.timing_cache_id = timing_cache_id(config)
        self.config = config
        self.phase = phase
        self.node = node
        self._label = f"{self.OP.name} '{node}'" if node else self.OP.name
        self._weighted = config.has_weight
        # Each normalised output's TensorRT dtype (None for the others, which take the activations').
        self._normalised_types = tuple(
            OUTPUT_DATA_TYPES[config.normalised_dtype(index)] if normalised else None
            for index, normalised in enumerate(self.OP.normalised_outputs)
        )
        self._input_names = self.OP.inputs(config.has_weight)
        self._table_count = len(self.OP.rotary_tables)
        self._same_type_as = self._type_ties()
        self._kernel: Any = None
        self._kernel_dtypes: tuple[str, str | None, str | None] | None = None
        self._warm_rows = 0
        self._rows: tuple[int, ...] = (0,) * len(self.OP.activations)
        self._part_rows: tuple[int, ...] = (0,) * len(self.OP.weights)
        self._extents: tuple[int, ...] = ()
        self._activation_count = len(self.OP.activations)
        self._no_weights = (0,) * len(self.OP.weights)
        self._has_shapes = False
        self._launch = self._launch_unprepared
        self._serialized: tuple[Any, Any] | None = None

    @property
    def kernel(self) -> Any:
        """The prepared kernel (shared by clones), or None before configure_plugin / on_shape_change."""
        return self._kernel

    @property
    def rows(self) -> tuple[int, ...]:
        """Row counts of the activations for the coming enqueues, from the last on_shape_change."""
        return self._rows

    # --- the kernel -----------------------------------------------------------------------------------------------

    def _make_kernel(self, dtypes: tuple[str, str | None, str | None]) -> Any:
        """The op's JIT kernel for these (activation, weight, table) dtypes, its spec the node's fields (a quantized
        op's with its quantizers, a rotary op's with its rotation)."""
        factory = getattr(self._kernels(), kernel_names(self.OP).jit)
        return factory(kernel_spec(self.config, *dtypes))

    def launch_args(self, inputs: Sequence[int], outputs: Sequence[int], stream: int) -> tuple[int, ...]:
        """The kernel's launch arguments (trtfuse/kernels/api.py), for any op: the activations, one weight per part
        (0 each without weights), a rotary op's tables, the outputs, one row count per part (its first activation's:
        the others have its shape), a rotary op's extents, the stream. RMSNorm: (x, w, y, rows, stream); QK-norm:
        (q, k, q_w, k_w, q_out, k_out, q_rows, k_rows, stream); add-norm: (x, residual, w, y, h, rows, stream);
        QK-norm + rotary: (q, k, q_w, k_w, cos, sin, q_out, k_out, q_rows, k_rows, batch, seq_len, cos_batch,
        stream)."""
        activations, tables = self._activation_count, self._table_count
        weights = inputs[activations : len(inputs) - tables] if self._weighted else self._no_weights
        return (
            *inputs[:activations],
            *weights,
            *inputs[len(inputs) - tables :],
            *outputs,
            *self._part_rows,
            *self._extents,
            stream,
        )

    def _kernels(self) -> ModuleType:
        """trtfuse.kernels, imported on first use so the plugins import (and deserialise) without CuTeDSL."""
        try:
            import trtfuse.kernels as kernels
        except ImportError as error:
            raise MissingDependencyError(
                f"{self._label} needs trtfuse.kernels (nvidia-cutlass-dsl): {error}"
            ) from error
        return kernels

    # --- core and capabilities ------------------------------------------------------------------------------------

    def get_capability_interface(self, type: Any) -> NormPlugin:
        return self

    def clone(self) -> NormPlugin:
        """A plugin with the same fields and the same prepared kernel (compiled code is immutable and shared); the
        per-call state (row counts, bound launch) is the twin's own."""
        twin = type(self)(self.config, self.phase, self.node)
        twin._kernel = self._kernel
        twin._kernel_dtypes = self._kernel_dtypes
        twin._warm_rows = self._warm_rows
        twin._set_rows(self._rows)
        twin._extents = self._extents
        twin._has_shapes = self._has_shapes
        twin._bind_launch()
        return twin

    def destroy(self) -> None:
        self._kernel = None
        self._kernel_dtypes = None
        self._warm_rows = 0
        self._has_shapes = False
        self._bind_launch()
        self._serialized = None

    # --- build ----------------------------------------------------------------------------------------------------

    def get_output_data_types(self, input_types: Sequence[Any]) -> list[Any]:
        self._check_input_count(len(input_types))
        for position in range(len(input_types)):
            self._dtype_name(input_types[position], position)
        return [self._output_type(input_types[0], index) for index in range(len(self.OP.outputs))]

    def get_output_shapes(self, inputs: Sequence[Any], shape_inputs: Sequence[Any], expr_builder: Any) -> list[Any]:
        """Each output of its part's first activation's dims, or their [B, H, S, D] where a rotary node moves heads
        (`contract.rotary_shapes.output_dims`; the head count a constant expression)."""
        self._check_input_count(len(inputs))
        rotary, shapes = self.config.rotary, []
        for index, part in enumerate(self.OP.output_parts):
            source = inputs[self._shape_source(index)]
            if rotary is None or not rotary.moves_heads:
                shapes.append(trt.DimsExprs(source))
                continue
            dims = output_dims(rotary, self.config.hidden_sizes[part], [source[i] for i in range(len(source))])
            shapes.append(trt.DimsExprs([expr_builder.constant(d) if isinstance(d, int) else d for d in dims]))
        return shapes

    def supports_format_combination(self, pos: int, in_out: Sequence[Any], num_inputs: int) -> bool:
        if num_inputs != len(self._input_names) or not 0 <= pos < len(self._same_type_as):
            return False
        desc = in_out[pos].desc
        if desc.format != trt.TensorFormat.LINEAR:
            return False
        if pos >= num_inputs and self.OP.normalised_outputs[pos - num_inputs]:
            return desc.type == self._normalised_types[pos - num_inputs]
        if desc.type not in DTYPE_NAMES:
            return False
        if pos == 0 and dtype_pair_problem(DTYPE_NAMES[desc.type], self.config.output_dtype):
            return False
        if pos == num_inputs - self._table_count and self._table_count:
            # cos (sin is tied to it): float32, or the activations' dtype.
            return DTYPE_NAMES[desc.type] == "float32" or desc.type == in_out[0].desc.type
        tied_to = self._same_type_as[pos]
        return tied_to is None or desc.type == in_out[tied_to].desc.type

    def configure_plugin(self, inputs: Sequence[Any], outputs: Sequence[Any]) -> None:
        """Build phase: check the profile's shapes and warm the kernel up for its largest row count."""
        self._check_input_count(len(inputs))
        for bound in ([desc.min for desc in inputs], [desc.max for desc in inputs]):
            rows = self._check_inputs(bound)
            rotary_extents(self.config, self._label, self._input_names, bound)
        self._prepare([desc.desc.type for desc in inputs], max(rows))

    # --- runtime --------------------------------------------------------------------------------------------------

    def on_shape_change(self, inputs: Sequence[Any], outputs: Sequence[Any]) -> None:
        """Concrete shapes for the enqueues that follow: keep their row counts, warm up if they grew."""
        self._check_input_count(len(inputs))
        shapes = [desc.dims for desc in inputs]
        rows = self._check_inputs(shapes)
        self._extents = rotary_extents(self.config, self._label, self._input_names, shapes)
        self._prepare([desc.type for desc in inputs], max(rows))
        self._set_rows(rows)
        self._has_shapes = True
        self._bind_launch()

    def set_tactic(self, tactic: int) -> None:
        """TensorRT's bindings treat this as required (a plugin without it fails every build and every run)."""
        if tactic != DEFAULT_TACTIC:
            raise TrtfuseError(f"{self._label}: TensorRT asked for tactic {tactic}; this plugin has only the default")

    def attach_to_context(self, resource_context: Any) -> NormPlugin:
        return self.clone()

    def get_fields_to_serialize(self) -> Any:
        # TensorRT reads the field data after this returns: the arrays live as long as the plugin.
        self._serialized = serialize_fields(self.config)
        return self._serialized[0]

    def enqueue(
        self,
        input_desc: Sequence[Any],
        output_desc: Sequence[Any],
        inputs: Sequence[int],
        outputs: Sequence[int],
        workspace: int,
        stream: int,
    ) -> None:
        self._launch(*self.launch_args(inputs, outputs, stream))

    # --- helpers --------------------------------------------------------------------------------------------------

    def _set_rows(self, rows: tuple[int, ...]) -> None:
        """The activations' row counts, and each part's (its first activation's) for the launch."""
        self._rows = rows
        self._part_rows = tuple(rows[self.OP.activation_parts.index(part)] for part in range(len(self.OP.weights)))

    def _type_ties(self) -> tuple[int | None, ...]:
        """For each position of inputs then outputs: the earlier position whose dtype it must share, or None (the
        first activation, the first weight, a rotary op's cos, and the normalised outputs, whose dtype is the
        node's)."""
        activations = len(self.OP.activations)
        ties: list[int | None] = [None] + [0] * (activations - 1)
        if self.config.has_weight:
            ties += [None] + [activations] * (len(self.OP.weights) - 1)
        if self._table_count:
            ties += [None] + [len(ties)] * (self._table_count - 1)
        return (*ties, *(None if normalised else 0 for normalised in self.OP.normalised_outputs))

    def _shape_source(self, output: int) -> int:
        """The activation whose shape output `output` has: its part's first."""
        return self.OP.activation_parts.index(self.OP.output_parts[output])

    def _output_type(self, input_type: Any, output: int) -> Any:
        """The normalised dtype for a normalised output, the activations' dtype for the others."""
        problem = dtype_pair_problem(self._dtype_name(input_type, 0), self.config.output_dtype)
        if problem is not None:
            raise TrtfuseError(f"{self._label}: {problem}")
        return self._normalised_types[output] if self.OP.normalised_outputs[output] else input_type

    def _check_input_count(self, count: int) -> None:
        if count != len(self._input_names):
            raise TrtfuseError(
                f"{self._label}: expected {len(self._input_names)} inputs ({', '.join(self._input_names)}) with "
                f"weight_mode {self.config.params.weight_mode.name}, got {count}"
            )

    def _dtype_name(self, data_type: Any, position: int) -> str:
        name = DTYPE_NAMES.get(data_type)
        if name is None:
            raise TrtfuseError(
                f"{self._label}: input '{self._input_names[position]}' has dtype {data_type.name}; "
                f"supported: {', '.join(DTYPE_NAMES.values())}"
            )
        return name

    def _check_inputs(self, shapes: Sequence[Any]) -> tuple[int, ...]:
        """Row counts of the activations (product of leading dims) after checking every input's shape: each
        activation ends in its part's hidden size, the activations of one part (x and residual) share one shape,
        each weight holds exactly one row of its part's (a rotary op's tables: `rotary_extents`)."""
        activations = len(self.OP.activations)
        rows = []
        part_shapes: dict[int, tuple[str, list[int]]] = {}
        for position, dims in enumerate(shapes[: len(shapes) - self._table_count]):
            part = self.OP.activation_parts[position] if position < activations else position - activations
            hidden = self.config.hidden_sizes[part]
            shape = [int(dims[i]) for i in range(len(dims))]
            name = self._input_names[position]
            if position >= activations:
                if not shape or shape[-1] != hidden or math.prod(shape) != hidden:
                    raise TrtfuseError(
                        f"{self._label}: input '{name}' has shape {shape}, expected [{hidden}] or [1, ..., 1, {hidden}]"
                    )
                continue
            if not shape or shape[-1] != hidden:
                raise TrtfuseError(f"{self._label}: input '{name}' has shape {shape}; its last dim must be {hidden}")
            if any(size < 0 for size in shape):
                raise TrtfuseError(f"{self._label}: input '{name}' has an unresolved dim in {shape}")
            first_name, first_shape = part_shapes.setdefault(part, (name, shape))
            # The kernel adds them element by element over the first one's rows: no broadcasting.
            if shape != first_shape:
                raise TrtfuseError(
                    f"{self._label}: inputs '{first_name}' {first_shape} and '{name}' {shape} must have one shape"
                )
            rows.append(math.prod(shape[:-1]))
        return tuple(rows)

    def _prepare(self, input_types: Sequence[Any], rows: int) -> None:
        activations = len(self.OP.activations)
        dtype = self._dtype_name(input_types[0], 0)
        weight_dtype = self._dtype_name(input_types[activations], activations) if self.config.has_weight else None
        first_table = len(input_types) - self._table_count
        table_dtype = self._dtype_name(input_types[first_table], first_table) if self._table_count else None
        dtypes = (dtype, weight_dtype, table_dtype)
        if self._kernel is None or self._kernel_dtypes != dtypes:
            self._kernel = self._make_kernel(dtypes)
            self._kernel_dtypes = dtypes
            self._warm_rows = 0
        if rows > self._warm_rows:
            self._kernel.warm_up(rows)
            self._warm_rows = rows

    def _bind_launch(self) -> None:
        """What enqueue calls: the kernel's launch once on_shape_change gave shapes; nothing for empty tensors (a
        launch of zero blocks is a CUDA error); an error before any shapes, rather than a launch of unknown size."""
        if self._kernel is None or not self._has_shapes:
            self._launch = self._launch_unprepared
        elif not any(self._rows):
            self._launch = self._launch_nothing
        else:
            self._launch = self._kernel.launch

    def _launch_unprepared(self, *args: int) -> None:
        raise TrtfuseError(f"{self._label}: enqueue before on_shape_change gave the shapes to launch for")

    def _launch_nothing(self, *args: int) -> None:
        return None


class NormPluginCreator(trt.IPluginCreatorV3One):
    """Creates `PLUGIN` instances from fields: the ONNX parser's node attributes, or a serialised engine's fields."""

    PLUGIN: ClassVar[type[NormPlugin]]

    def __init__(self) -> None:
        trt.IPluginCreatorV3One.__init__(self)
        self.name = self.PLUGIN.OP.name
        self.plugin_namespace = PLUGIN_NAMESPACE
        self.plugin_version = PLUGIN_VERSION
        self.field_names, self._field_arrays = advertised_fields(self.PLUGIN.OP.name)

    def create_plugin(self, name: str, field_collection: Any, phase: Any) -> NormPlugin:
        try:
            return self.PLUGIN(parse_fields(self.PLUGIN.OP.name, field_collection, name), phase, name)
        except TrtfuseError as error:
            # TensorRT's binding prints the exception and hands the parser a null plugin, whose own message does
            # not say why; the build reads this back to name the node and the field at fault.
            record_creation_error(str(error))
            raise
