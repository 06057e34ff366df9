"""Reference semantics of the fused nodes: each one lowered to standard ONNX ops, so onnxruntime runs fused models.

The lowering is the contract's definition written as a graph (see `contract.WeightMode`): the square, mean, epsilon
and root in fp32, the weight plus its offset in fp32, and the casts exactly where the weight mode puts them: to the
node's 16-bit dtype R before an AFTER_CAST weight multiply, to the output dtype T at the end. The add-norm's h is
Cast(Add(Cast(x, fp32), Cast(residual, fp32)), D), written to its own output, and its y is the norm of that rounded h.
A quantized node's stages are standard QuantizeLinear / DequantizeLinear nodes on float32 values with float32 scales
and zero point 0 (onnxruntime's own arithmetic, which the contract's quantizers are defined to equal): the input
stage on x (or the rounded h), the rsqrt stage on the inverse root, each dequantized in float32 and rounded once to
its dequant dtype, the rsqrt stage's Q reading r rounded to its input dtype first (a Cast and back, where the graph
cast r to 16 bits); the output stage quantizes y's T value into the node's output, that float32 value named after the
output (`quantizer_input`) so that `check` can read what the node quantized. A rotary node rotates the float32 y
(before its rounding to T) by its cos and sin tables, widened to float32: each head row's first R elements become
y·cos + rotate(y)·sin (each product and the sum a float32 op, as the contract rounds them), the rest pass through,
and the result is rounded to T once; with a part's normalised stage, y is rounded to T and goes through that stage's
DQ(Q(·)) first; with its product stages, as the graph rounds them: y to T, each product to T and through its stage's
DQ(Q(·)) into T, and the sum to T. What each of those stages' Q reads, its codes and its DQ value are named after the
output (`stage_tensors`), and so are a rotary part's rsqrt stage's.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from trtfuse import contract
from trtfuse.errors import TrtfuseError, first_line
from trtfuse.fusion.fused_nodes import PluginNode, plugin_nodes
from trtfuse.model.onnx_file import DEFAULT_DOMAINS

_FLOAT = TensorProto.FLOAT
# A Slice end past any axis: to the end.
_END = np.iinfo(np.int64).max


def quantizer_input(output: str) -> str:
    """The name of the float32 value (y rounded to T) that the QuantizeLinear writing a node's quantized output
    `output` reads in the lowering."""
    return f"{output}/quantizer_input"


@dataclass(frozen=True)
class StageTensors:
    """The lowering's names of one stage of a rotary node's part (its rsqrt stage, its normalised stage, a product
    stage), so that `check` can judge the stage where its quantizer reads: `value`, the float32 value rounded to T
    (the rsqrt stage: to its quantizer's input dtype) that the stage's Q reads; `codes`, what that Q writes;
    `dequantized`, the stage's DQ value (rounded to its dequant dtype) in float32."""

    value: str
    codes: str
    dequantized: str


def stage_tensors(output: str, stage: contract.QuantStage) -> StageTensors:
    """The names of stage `stage` (`rsqrt`, `normalised`, `cos_product` or `sin_product`) of the rotary node's part
    whose output is `output`."""
    base = f"{output}/{stage.norm_stage.value}"
    return StageTensors(f"{base}/quantizer_input", f"{base}/codes", f"{base}/dequantized")


def lower_fused_nodes(model: onnx.ModelProto, source: str | Path = "the fused model") -> onnx.ModelProto:
    """A copy of `model` in which every trtfuse node is replaced by standard ops; `source` names the file in errors."""
    lowered = onnx.ModelProto()
    lowered.CopyFrom(model)
    plugins = iter(plugin_nodes(lowered, source))  # in graph order
    elem_types = _elem_types(lowered)
    opset = next(opset.version for opset in lowered.opset_import if opset.domain in DEFAULT_DOMAINS)
    nodes: list[onnx.NodeProto] = []
    for node in lowered.graph.node:
        if node.domain != contract.ONNX_DOMAIN:
            nodes.append(node)
            continue
        builder = _Lowering(next(plugins), elem_types, opset)
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
    """Builds the standard-op replacement of one plugin node, one normalisation per part of its op."""

    def __init__(self, plugin: PluginNode, elem_types: dict[str, int], opset: int) -> None:
        self.plugin = plugin
        self.elem_types = elem_types
        self.opset = opset
        self.nodes: list[onnx.NodeProto] = []
        self.constants: list[onnx.TensorProto] = []
        node = plugin.node
        self.prefix = f"{node.name or node.output[0]}/reference"
        self._tables: tuple[str, str] | None = None

    def lower(self) -> list[onnx.NodeProto]:
        plugin = self.plugin
        op = plugin.op
        if plugin.dtype is None:
            raise TrtfuseError(f"{plugin.where}: dtype of its input '{plugin.activations[0]}' is unknown")
        out_type = contract.OUTPUT_DTYPE_CODES[plugin.fields.output_dtype]
        weights = plugin.weights or (None,) * len(op.hidden_fields)
        for part, weight in enumerate(weights):
            activations = [
                name for name, owner in zip(plugin.activations, op.activation_parts, strict=True) if owner == part
            ]
            # Per part: one normalised output, and (for a part of several activations) the sum's output.
            outputs = {
                normalised: name
                for name, owner, normalised in zip(
                    plugin.node.output, op.output_parts, op.normalised_outputs, strict=True
                )
                if owner == part
            }
            role = op.activations[op.activation_parts.index(part)]
            x = activations[0] if len(activations) == 1 else self._sum(role, activations, outputs[False])
            self._norm(role, x, weight, outputs[True], out_type, plugin.fields.part_quant(part))
        return self.nodes

    def _fake_quant(
        self,
        tensor: str,
        stage: contract.QuantStage,
        name: str,
        quant: contract.QuantParams | None,
        exposed: StageTensors | None = None,
    ) -> str:
        """`tensor` (float32) through the stage's DQ(Q(·)), Q reading it rounded to the quantizer's input dtype
        (the rsqrt stage's r, as the graph rounded it), dequantized in float32 and rounded once to the dequant
        dtype, back in float32; `tensor` itself where the stage is off (or the norm has no quantizers, `quant`).
        `exposed` names what Q reads, its codes and the result (a rotary part's stage, for `check`)."""
        quantizer = None if quant is None else quant.at(stage)
        if quantizer is None:
            return tensor
        name = f"{name}/{stage.value}_quant"
        input_type = contract.OUTPUT_DTYPE_CODES[quantizer.input_dtype or "float32"]
        rounded = self._cast(
            self._cast(tensor, input_type, f"{name}/round_input"),
            _FLOAT,
            f"{name}/round_input_fp32",
            output=exposed and exposed.value,
        )
        quantized = self._quantize(rounded, quantizer, name, output=exposed and exposed.codes)
        scale, zero_point = self._quantizer_operands(quantizer, name)
        dequantized = self._op("DequantizeLinear", [quantized, scale, zero_point], f"{name}/dequantize")
        rounded = self._cast(dequantized, contract.OUTPUT_DTYPE_CODES[quantizer.dequant_dtype], f"{name}/round")
        return self._cast(rounded, _FLOAT, f"{name}/round_fp32", output=exposed and exposed.dequantized)

    def _quantize(self, tensor: str, quantizer: contract.Quantizer, name: str, output: str | None = None) -> str:
        scale, zero_point = self._quantizer_operands(quantizer, name)
        attributes = {"saturate": int(quantizer.saturate)} if quantizer.dtype == "float8_e4m3fn" else {}
        code = contract.QUANT_DTYPE_CODES[quantizer.dtype]
        inputs = [tensor, scale, zero_point]
        return self._op("QuantizeLinear", inputs, f"{name}/quantize", output=output, elem_type=code, **attributes)

    def _quantizer_operands(self, quantizer: contract.Quantizer, name: str) -> tuple[str, str]:
        """The float32 scale and the zero point 0 of the quantizer's dtype, made once per stage."""
        scale, zero_point = f"{name}/scale", f"{name}/zero_point"
        if scale not in self.elem_types:
            self._constant(scale, quantizer.scale)
            code = contract.QUANT_DTYPE_CODES[quantizer.dtype]
            self.constants.append(helper.make_tensor(zero_point, code, [], [0]))
            self.elem_types[zero_point] = code
        return scale, zero_point

    def _sum(self, role: str, activations: list[str], h: str) -> str:
        """The part's activations added in fp32 and rounded once to their dtype D (for 16-bit D the correctly rounded
        sum) into output `h`: the value the norm then reads, so r comes from the rounded sum."""
        name = f"{self.prefix}/{role}/sum"
        total = self._cast(activations[0], _FLOAT, f"{name}/input0_fp32")
        for index, activation in enumerate(activations[1:], start=1):
            addend = self._cast(activation, _FLOAT, f"{name}/input{index}_fp32")
            total = self._op("Add", [total, addend], f"{name}/add{index}")
        return self._cast(total, contract.OUTPUT_DTYPE_CODES[self.plugin.dtype], f"{name}/h", output=h)

    def _norm(
        self, role: str, x: str, weight: str | None, y: str, out_type: int, quant: contract.QuantParams | None
    ) -> None:
        """One norm of x into y, with its quantizers `quant` (one norm's stages, `NodeFields.part_quant`)."""
        params = self.plugin.fields.params
        mode = params.weight_mode
        round_type = contract.OUTPUT_DTYPE_CODES[
            contract.rounding_dtype(self.plugin.dtype, self.plugin.fields.output_dtype)
        ]
        name = f"{self.prefix}/{role}"
        x32 = self._fake_quant(self._cast(x, _FLOAT, f"{name}/x_fp32"), contract.QuantStage.INPUT, name, quant)
        square = self._op("Mul", [x32, x32], f"{name}/square")
        mean = self._reduce_mean(square, f"{name}/mean")
        epsilon = self._constant(f"{name}/epsilon", params.epsilon)
        variance = self._op("Add", [mean, epsilon], f"{name}/add_epsilon")
        root = self._op("Sqrt", [variance], f"{name}/sqrt")
        inverse_root = self._op("Reciprocal", [root], f"{name}/rsqrt")
        rsqrt = contract.QuantStage.RSQRT
        exposed = stage_tensors(y, rsqrt) if self.plugin.fields.rotary is not None else None
        inverse_root = self._fake_quant(inverse_root, rsqrt, name, quant, exposed)
        normalised = self._op("Mul", [x32, inverse_root], f"{name}/normalise")
        if mode == contract.WeightMode.NONE:
            value = normalised
        elif mode == contract.WeightMode.AFTER_CAST:
            rounded = self._cast(self._cast(normalised, round_type, f"{name}/round"), _FLOAT, f"{name}/round_fp32")
            value = self._op("Mul", [rounded, self._scale(weight, params.weight_offset, name)], f"{name}/scale")
        else:
            value = self._op("Mul", [normalised, self._scale(weight, params.weight_offset, name)], f"{name}/scale")
        self._output(self._rotated(value, x, name, out_type, quant, y), out_type, name, y, quant)

    def _rotated(
        self, y: str, x: str, name: str, out_type: int, quant: contract.QuantParams | None, output: str
    ) -> str:
        """The float32 y of a rotary node rotated (docs/plugin-nodes.md, "Rotary embedding"), else y itself. Token-
        major rows are viewed as [B, S, H, D] (a [B, S, H·D] one reshaped, and back to x's shape after, or
        transposed to [B, H, S, D] where the node moves heads, `RotaryParams.moves_heads`), head-major ones are
        [B, H, S, D]; the tables, [Bc, S, R], get a head axis of 1 and broadcast over the heads. With the part's
        normalised stage on, y is rounded to T and goes through its DQ(Q(·)); with its product stages on, y is
        rounded to T first and each product rounded to T and through its stage's DQ(Q(·)) before the sum, which is
        rounded to T; each of those stages' tensors named after the part's `output` (`stage_tensors`)."""
        rotary = self.plugin.fields.rotary
        if rotary is None:
            return y
        if quant is not None and quant.normalised is not None:
            stage = contract.QuantStage.NORMALISED
            y = self._fake_quant(
                self._round_to(y, out_type, f"{name}/y_normalised"), stage, name, quant, stage_tensors(output, stage)
            )
        products = quant is not None and quant.cos_product is not None
        if products:
            y = self._round_to(y, out_type, f"{name}/rope/y")
        head, rotary_dim = rotary.head_dim, rotary.rotary_dim
        half = rotary_dim // 2
        name = f"{name}/rope"
        token_major = rotary.layout is contract.HeadLayout.TOKEN_MAJOR
        rows = self._reshaped(y, [0, 0, -1, head], f"{name}/heads") if token_major else y
        if rotary.moves_heads:
            # Into the outputs' [B, H, S, D] before the rotation, as the graph the node replaced rotates there: each
            # product stage then holds its values where the graph's QuantizeLinear reads them.
            rows = self._op("Transpose", [rows], f"{name}/head_major", perm=[0, 2, 1, 3])
            token_major = False
        cos, sin = self._rotary_tables(head_axis=2 if token_major else 1)
        turned = rows if rotary_dim == head else self._slice(rows, 0, rotary_dim, f"{name}/rotated_part")
        if rotary.rotation is contract.Rotation.HALF_SPLIT:
            first, second = (
                self._slice(turned, 0, half, f"{name}/first"),
                self._slice(turned, half, None, f"{name}/second"),
            )
            partner = self._op("Concat", [self._op("Neg", [second], f"{name}/neg"), first], f"{name}/partner", axis=-1)
        else:
            pairs = self._reshaped(turned, [0, 0, 0, half, 2], f"{name}/pairs")
            even, odd = self._slice(pairs, 0, 1, f"{name}/even"), self._slice(pairs, 1, 2, f"{name}/odd")
            swapped = self._op("Concat", [self._op("Neg", [odd], f"{name}/neg"), even], f"{name}/swapped", axis=-1)
            partner = self._reshaped(swapped, [0, 0, 0, rotary_dim], f"{name}/partner")
        cos_term = self._op("Mul", [turned, cos], f"{name}/cos_term")
        sin_term = self._op("Mul", [partner, sin], f"{name}/sin_term")
        if products:
            cos_term, sin_term = (
                self._fake_quant(self._round_to(term, out_type, term), stage, name, quant, stage_tensors(output, stage))
                for term, stage in (
                    (cos_term, contract.QuantStage.COS_PRODUCT),
                    (sin_term, contract.QuantStage.SIN_PRODUCT),
                )
            )
        out = self._op("Add", [cos_term, sin_term], f"{name}/rotate")
        if products:
            out = self._round_to(out, out_type, out)
        if rotary_dim < head:
            passed = self._slice(rows, rotary_dim, None, f"{name}/passed")
            out = self._op("Concat", [out, passed], f"{name}/with_passed", axis=-1)
        if not token_major:
            return out
        shape = self._op("Shape", [x], f"{name}/shape", elem_type=TensorProto.INT64)
        return self._op("Reshape", [out, shape], f"{name}/rows")

    def _rotary_tables(self, head_axis: int) -> tuple[str, str]:
        """cos and sin in float32 with a head axis of 1 at `head_axis`, made once per node (both parts read them)."""
        if self._tables is None:
            cos, sin = self.plugin.tables
            self._tables = tuple(
                self._unsqueezed(
                    self._cast(table, _FLOAT, f"{self.prefix}/{role}_fp32"), head_axis, f"{self.prefix}/{role}"
                )
                for role, table in (("cos", cos), ("sin", sin))
            )
        return self._tables

    def _slice(self, tensor: str, start: int, end: int | None, name: str) -> str:
        """`tensor[..., start:end]` (to the end where `end` is None)."""
        bounds = [self._ints(f"{name}/{role}", [value]) for role, value in (("start", start), ("end", end or _END))]
        return self._op("Slice", [tensor, *bounds, self._ints(f"{name}/axes", [-1])], name)

    def _reshaped(self, tensor: str, shape: list[int], name: str) -> str:
        return self._op("Reshape", [tensor, self._ints(f"{name}/shape", shape)], name)

    def _unsqueezed(self, tensor: str, axis: int, name: str) -> str:
        if self.opset >= 13:
            return self._op("Unsqueeze", [tensor, self._ints(f"{name}/axes", [axis])], name)
        return self._op("Unsqueeze", [tensor], name, axes=[axis])

    def _ints(self, name: str, values: list[int]) -> str:
        self.constants.append(numpy_helper.from_array(np.array(values, dtype=np.int64), name))
        self.elem_types[name] = TensorProto.INT64
        return name

    def _output(self, value: str, out_type: int, name: str, y: str, quant: contract.QuantParams | None) -> None:
        """y: `value` rounded to T, then quantized where the output stage is on (Q reads the T value as the graph's
        QuantizeLinear read it)."""
        quantizer = None if quant is None else quant.output
        if quantizer is None:
            self._cast(value, out_type, f"{name}/y", output=y)
            return
        rounded = self._cast(value, out_type, f"{name}/y_rounded")
        quantized_value = self._cast(rounded, _FLOAT, f"{name}/y_rounded_fp32", output=quantizer_input(y))
        self._quantize(quantized_value, quantizer, f"{name}/output_quant", output=y)

    def _round_to(self, tensor: str, to: int, name: str) -> str:
        """A float32 `tensor` rounded once to `to`, back in float32."""
        return self._cast(self._cast(tensor, to, f"{name}/rounded"), _FLOAT, f"{name}/rounded_fp32")

    def _scale(self, weight: str, offset: float, name: str) -> str:
        weight32 = self._cast(weight, _FLOAT, f"{name}/weight_fp32")
        if offset == 0.0:
            return weight32
        return self._op("Add", [weight32, self._constant(f"{name}/weight_offset", offset)], f"{name}/offset_weight")

    def _elem_type(self, tensor: str) -> int:
        if tensor not in self.elem_types:
            raise TrtfuseError(f"{self.plugin.where}: dtype of tensor '{tensor}' is unknown")
        return self.elem_types[tensor]

    def _op(
        self,
        op_type: str,
        inputs: list[str],
        name: str,
        output: str | None = None,
        elem_type: int = _FLOAT,
        **attrs: object,
    ) -> str:
        """A node whose result is fp32 (as every op of the lowering but the casts and quantizers computes in fp32),
        a Cast's `to`, or `elem_type`."""
        output = output or name
        self.nodes.append(helper.make_node(op_type, inputs, [output], name=name, **attrs))
        self.elem_types[output] = attrs.get("to", elem_type)
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
