"""Reference semantics of the fused nodes: each one lowered to standard ONNX ops, so onnxruntime runs fused models.

The lowering is the contract's definition written as a graph (see `contract.WeightMode`): the square, mean, epsilon
and root in fp32, the weight plus its offset in fp32, and the casts exactly where the weight mode puts them: to the
node's 16-bit dtype R before an AFTER_CAST weight multiply, to the output dtype T at the end.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from trtfuse import contract
from trtfuse.errors import TrtfuseError, first_line
from trtfuse.model_io import DEFAULT_DOMAINS

_FLOAT = TensorProto.FLOAT
_DTYPE_NAMES = {code: name for name, code in contract.OUTPUT_DTYPE_CODES.items()}


def lower_fused_nodes(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of `model` in which every TrtfuseRmsNorm / TrtfuseQkNorm node is replaced by standard ops."""
    lowered = onnx.ModelProto()
    lowered.CopyFrom(model)
    elem_types = _elem_types(lowered)
    opset = next(opset.version for opset in lowered.opset_import if opset.domain in DEFAULT_DOMAINS)
    nodes: list[onnx.NodeProto] = []
    for node in lowered.graph.node:
        if node.domain != contract.ONNX_DOMAIN or node.op_type not in contract.FUSED_OPS:
            nodes.append(node)
            continue
        builder = _Lowering(node, elem_types, opset)
        nodes.extend(builder.lower())
        lowered.graph.initializer.extend(builder.constants)
    del lowered.graph.node[:]
    lowered.graph.node.extend(nodes)
    kept_opsets = [opset for opset in lowered.opset_import if opset.domain != contract.ONNX_DOMAIN]
    del lowered.opset_import[:]
    lowered.opset_import.extend(kept_opsets)
    return lowered


def _elem_types(model: onnx.ModelProto) -> dict[str, int]:
    """Element type of every tensor that declares one, shape inference filling in what the graph leaves out."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except (onnx.shape_inference.InferenceError, onnx.checker.ValidationError) as error:
        raise TrtfuseError(f"the fused model fails ONNX shape inference: {first_line(error)}") from None
    types = {}
    graph = inferred.graph
    for value in [*graph.value_info, *graph.input, *graph.output]:
        if value.type.HasField("tensor_type") and value.type.tensor_type.elem_type:
            types[value.name] = value.type.tensor_type.elem_type
    for tensor in graph.initializer:
        types[tensor.name] = tensor.data_type
    return types


class _Lowering:
    """Builds the standard-op replacement of one fused node."""

    def __init__(self, node: onnx.NodeProto, elem_types: dict[str, int], opset: int) -> None:
        self.node = node
        self.elem_types = elem_types
        self.opset = opset
        self.attributes = {attribute.name: helper.get_attribute_value(attribute) for attribute in node.attribute}
        self.nodes: list[onnx.NodeProto] = []
        self.constants: list[onnx.TensorProto] = []
        self.prefix = f"{node.name or node.output[0]}/reference"

    def lower(self) -> list[onnx.NodeProto]:
        fields = contract.RMS_NORM_FIELDS if self.node.op_type == contract.RMS_NORM_OP else contract.QK_NORM_FIELDS
        missing = [field for field in fields if field not in self.attributes]
        if missing:
            raise TrtfuseError(f"node '{self.node.name}': {self.node.op_type} lacks attribute(s) {', '.join(missing)}")
        params = contract.NormParams(
            self.attributes[contract.ATTR_EPSILON],
            self.attributes[contract.ATTR_WEIGHT_OFFSET],
            self.attributes[contract.ATTR_WEIGHT_MODE],
        )
        inputs = list(self.node.input)
        out_type = self._output_type(inputs[0])
        if self.node.op_type == contract.RMS_NORM_OP:
            weight = inputs[1] if len(inputs) > 1 and inputs[1] else None
            self._norm("x", inputs[0], weight, self.node.output[0], params, out_type)
        else:
            q_weight = inputs[2] if len(inputs) > 2 and inputs[2] else None
            k_weight = inputs[3] if len(inputs) > 3 and inputs[3] else None
            self._norm("q", inputs[0], q_weight, self.node.output[0], params, out_type)
            self._norm("k", inputs[1], k_weight, self.node.output[1], params, out_type)
        return self.nodes

    def _output_type(self, x: str) -> int:
        """The `output_dtype` attribute, or x's dtype for a node written before the attribute existed."""
        if contract.ATTR_OUTPUT_DTYPE not in self.attributes:
            return self._elem_type(x)
        code = self.attributes[contract.ATTR_OUTPUT_DTYPE]
        if code not in _DTYPE_NAMES:
            allowed = ", ".join(f"{code} ({name})" for code, name in _DTYPE_NAMES.items())
            raise TrtfuseError(f"node '{self.node.name}': output_dtype must be one of {allowed}, got {code}")
        return code

    def _norm(self, role: str, x: str, weight: str | None, y: str, params: contract.NormParams, out_type: int) -> None:
        mode = params.weight_mode
        if (mode == contract.WeightMode.NONE) != (weight is None):
            raise TrtfuseError(f"node '{self.node.name}': weight_mode {mode.name} does not fit its {role} weight input")
        x_dtype = helper.tensor_dtype_to_np_dtype(self._elem_type(x)).name
        out_dtype = _DTYPE_NAMES[out_type]
        problem = contract.dtype_pair_problem(x_dtype, out_dtype)
        if problem is not None:
            raise TrtfuseError(f"node '{self.node.name}': {role}: {problem}")
        declared = self.elem_types.get(y, out_type)
        if declared != out_type:
            declared_name = helper.tensor_dtype_to_np_dtype(declared).name
            raise TrtfuseError(
                f"node '{self.node.name}': output '{y}' is declared {declared_name}, but output_dtype is {out_dtype}"
            )
        round_type = contract.OUTPUT_DTYPE_CODES[contract.rounding_dtype(x_dtype, out_dtype)]
        name = f"{self.prefix}/{role}"
        x32 = self._cast(x, _FLOAT, f"{name}/x_fp32")
        square = self._op("Mul", [x32, x32], f"{name}/square")
        mean = self._reduce_mean(square, f"{name}/mean")
        epsilon = self._constant(f"{name}/epsilon", params.epsilon)
        variance = self._op("Add", [mean, epsilon], f"{name}/add_epsilon")
        root = self._op("Sqrt", [variance], f"{name}/sqrt")
        inverse_root = self._op("Reciprocal", [root], f"{name}/rsqrt")
        normalised = self._op("Mul", [x32, inverse_root], f"{name}/normalise")
        if mode == contract.WeightMode.NONE:
            self._cast(normalised, out_type, f"{name}/y", output=y)
            return
        scale = self._scale(weight, params.weight_offset, name)
        if mode == contract.WeightMode.AFTER_CAST:
            rounded = self._cast(self._cast(normalised, round_type, f"{name}/round"), _FLOAT, f"{name}/round_fp32")
            self._cast(self._op("Mul", [rounded, scale], f"{name}/scale"), out_type, f"{name}/y", output=y)
        else:
            self._cast(self._op("Mul", [normalised, scale], f"{name}/scale"), out_type, f"{name}/y", output=y)

    def _scale(self, weight: str, offset: float, name: str) -> str:
        weight32 = self._cast(weight, _FLOAT, f"{name}/weight_fp32")
        if offset == 0.0:
            return weight32
        return self._op("Add", [weight32, self._constant(f"{name}/weight_offset", offset)], f"{name}/offset_weight")

    def _elem_type(self, tensor: str) -> int:
        if tensor not in self.elem_types:
            raise TrtfuseError(f"node '{self.node.name}': dtype of tensor '{tensor}' is unknown")
        return self.elem_types[tensor]

    def _op(self, op_type: str, inputs: list[str], name: str, output: str | None = None, **attrs: object) -> str:
        """A node whose result is fp32, as every op of the lowering but the casts computes in fp32."""
        output = output or name
        self.nodes.append(helper.make_node(op_type, inputs, [output], name=name, **attrs))
        self.elem_types[output] = attrs.get("to", _FLOAT)
        return output

    def _cast(self, tensor: str, to: int, name: str, output: str | None = None) -> str:
        if output is None and self._elem_type(tensor) == to:
            return tensor
        return self._op("Cast", [tensor], name, output=output, to=to)

    def _reduce_mean(self, tensor: str, name: str) -> str:
        if self.opset >= 18:
            axes = self._constant(f"{name}/axes", -1, np.int64, shape=(1,))
            return self._op("ReduceMean", [tensor, axes], name, keepdims=1)
        return self._op("ReduceMean", [tensor], name, axes=[-1], keepdims=1)

    def _constant(self, name: str, value: float, dtype: type = np.float32, shape: tuple[int, ...] = ()) -> str:
        self.constants.append(numpy_helper.from_array(np.full(shape, value, dtype=dtype), name))
        self.elem_types[name] = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
        return name
