"""Activations that ops quantize on the fly, computed unrounded in the float32 evaluation (`verify.widening`).

`MatMulNBits` with an `accuracy_level` (4: int8) quantizes its float input block by block before the product,
`DynamicQuantizeLinear` -> `MatMulInteger` quantizes it to uint8 with a scale of its range, and onnxruntime's fused
`DynamicQuantizeMatMul` does both in one op. All are roundings of a
computed value, as an activation Q/DQ pair is: a last-bit change before them (a fused norm summing in another order)
moves one quantization step. Kept in the float32 evaluation, the original would agree with it exactly and the
candidate would be judged by float32's tolerance, passing or failing with the seed; computed unrounded, the evaluation
measures the original's own quantization error, which the candidate's is held to. Stored weights stay quantized.
"""

from __future__ import annotations

import onnx
from onnx import TensorProto, helper

_MICROSOFT = "com.microsoft"


def compute_activations_unrounded(graph: onnx.GraphProto) -> None:
    """In place: every `MatMulNBits` computes with its float input as given (accuracy level unset), every
    `MatMulInteger` fed by a `DynamicQuantizeLinear` multiplies that quantizer's unrounded input, and every
    `DynamicQuantizeMatMul` multiplies its float input by its dequantized weight, in float32."""
    nodes: list[onnx.NodeProto] = []
    for node in graph.node:
        if node.op_type == "MatMulNBits" and node.domain == _MICROSOFT:
            kept = [attribute for attribute in node.attribute if attribute.name != "accuracy_level"]
            del node.attribute[:]
            node.attribute.extend(kept)
        nodes.extend(_dequantized_product(node) if node.op_type == "DynamicQuantizeMatMul" else [node])
    del graph.node[:]
    graph.node.extend(nodes)
    _unround_dynamic_quantization(graph)


def _dequantized_product(product: onnx.NodeProto) -> list[onnx.NodeProto]:
    """DynamicQuantizeMatMul(A, B, B_scale, B_zero, bias) as MatMul(A, (B - B_zero) * B_scale) + bias."""
    if product.domain != _MICROSOFT or len(product.input) < 3:
        return [product]
    a, b, scale = product.input[:3]
    zero = product.input[3] if len(product.input) > 3 else ""
    bias = product.input[4] if len(product.input) > 4 else ""
    prefix = f"{product.name or product.output[0]}/unrounded"
    weight = f"{prefix}/b"
    nodes = [helper.make_node("Cast", [b], [weight], to=TensorProto.FLOAT, name=weight)]
    if zero:
        nodes += [
            helper.make_node("Cast", [zero], [f"{prefix}/b_zero"], to=TensorProto.FLOAT, name=f"{prefix}/b_zero"),
            helper.make_node("Sub", [weight, f"{prefix}/b_zero"], [f"{prefix}/b_shifted"], name=f"{prefix}/b_shifted"),
        ]
        weight = f"{prefix}/b_shifted"
    nodes.append(helper.make_node("Mul", [weight, scale], [f"{prefix}/b_float"], name=f"{prefix}/b_float"))
    result = product.output[0]
    if bias:
        nodes.append(helper.make_node("MatMul", [a, f"{prefix}/b_float"], [f"{prefix}/ab"], name=f"{prefix}/ab"))
        nodes.append(helper.make_node("Add", [f"{prefix}/ab", bias], [result], name=product.name))
    else:
        nodes.append(helper.make_node("MatMul", [a, f"{prefix}/b_float"], [result], name=product.name))
    return nodes


def _unround_dynamic_quantization(graph: onnx.GraphProto) -> None:
    """MatMulInteger(y, B, y_zero, B_zero) with y, y_scale, y_zero = DynamicQuantizeLinear(x) becomes
    MatMul(x / y_scale, B - B_zero) in float32 (without its a_zero_point, x / y_scale + y_zero), where every consumer
    of its int32 product is a Cast to float32 (onnxruntime's dynamic quantization), which then passes the float
    product on unchanged."""
    producers = {output: node for node in graph.node for output in node.output}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    graph_outputs = {value.name for value in graph.output}
    nodes: list[onnx.NodeProto] = []
    for node in graph.node:
        quantizer = producers.get(node.input[0]) if node.op_type == "MatMulInteger" and node.input else None
        if (
            quantizer is None
            or quantizer.op_type != "DynamicQuantizeLinear"
            or not _reads_as_float(node, quantizer, consumers, graph_outputs)
        ):
            nodes.append(node)
            continue
        nodes.extend(_float_product(node, quantizer))
    del graph.node[:]
    graph.node.extend(nodes)


def _reads_as_float(
    product: onnx.NodeProto,
    quantizer: onnx.NodeProto,
    consumers: dict[str, list[onnx.NodeProto]],
    graph_outputs: set[str],
) -> bool:
    """Whether `product`'s a_zero_point is absent or the quantizer's, and only Casts to float32 read its result."""
    a_zero = product.input[2] if len(product.input) > 2 else ""
    readers = consumers.get(product.output[0], [])
    return (
        a_zero in ("", quantizer.output[2])
        and product.output[0] not in graph_outputs
        and bool(readers)
        and all(reader.op_type == "Cast" and _cast_target(reader) == TensorProto.FLOAT for reader in readers)
    )


def _cast_target(node: onnx.NodeProto) -> int | None:
    return next((attribute.i for attribute in node.attribute if attribute.name == "to"), None)


def _float_product(product: onnx.NodeProto, quantizer: onnx.NodeProto) -> list[onnx.NodeProto]:
    prefix = f"{product.name or product.output[0]}/unrounded"
    x, scale, zero = quantizer.input[0], quantizer.output[1], quantizer.output[2]
    a, b = f"{prefix}/a", f"{prefix}/b"
    nodes = [
        helper.make_node("Div", [x, scale], [a], name=a),
        helper.make_node("Cast", [product.input[1]], [b], to=TensorProto.FLOAT, name=b),
    ]
    if len(product.input) <= 2 or not product.input[2]:
        nodes += [
            helper.make_node("Cast", [zero], [f"{prefix}/a_zero"], to=TensorProto.FLOAT, name=f"{prefix}/a_zero"),
            helper.make_node("Add", [a, f"{prefix}/a_zero"], [f"{prefix}/a_shifted"], name=f"{prefix}/a_shifted"),
        ]
        a = f"{prefix}/a_shifted"
    if len(product.input) > 3 and product.input[3]:
        nodes += [
            helper.make_node(
                "Cast", [product.input[3]], [f"{prefix}/b_zero"], to=TensorProto.FLOAT, name=f"{prefix}/b_zero"
            ),
            helper.make_node("Sub", [b, f"{prefix}/b_zero"], [f"{prefix}/b_shifted"], name=f"{prefix}/b_shifted"),
        ]
        b = f"{prefix}/b_shifted"
    nodes.append(helper.make_node("MatMul", [a, b], [product.output[0]], name=product.name))
    return nodes
