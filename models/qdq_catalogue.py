"""Catalogue the Q/DQ nodes around every RMSNorm of quantized exports (ModelOpt): the chain from the norm's input
back to the op that made it (the residual Add, a MatMul, ...), the pair on the inverse root, and the chain from the
norm's output to its readers, with every Cast, scale and zero-point dtype and shape and `saturate` attribute.

A norm is found by its `ReduceMean(Pow(x, 2))` (or `Mul(x, x)`); its output is the last node of the single-reader
run of Mul / Cast nodes after the `Mul(x, inverse root)`. Norms with the same description are counted together,
so each file prints a few lines. Runs in the main environment (onnx only):

\b
    python models/qdq_catalogue.py /work/exports/modelopt/*-modelopt-fp8.onnx
    python models/qdq_catalogue.py --json catalogue.json /work/exports/modelopt/*.onnx
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import click
import onnx
import onnx.numpy_helper
from onnx import TensorProto, helper

QDQ = ("QuantizeLinear", "DequantizeLinear")
# Readers that pass the norm's values on unchanged in value (a reshape of q/k heads before or after their norm).
LAYOUT_OPS = ("Reshape", "Transpose")


@dataclass
class Graph:
    """One model's nodes indexed by the tensors they make and read, with every tensor's element type."""

    model: onnx.ModelProto

    def __post_init__(self) -> None:
        graph = self.model.graph
        self.initializers = {tensor.name: tensor for tensor in graph.initializer}
        self.producer = {output: node for node in graph.node for output in node.output}
        self.readers: dict[str, list[onnx.NodeProto]] = {}
        for node in graph.node:
            for name in node.input:
                self.readers.setdefault(name, []).append(node)
        for value in graph.output:
            self.readers.setdefault(value.name, []).append(helper.make_node("GraphOutput", [value.name], []))
        inferred = onnx.shape_inference.infer_shapes(self.model)
        self.types = {
            value.name: value.type.tensor_type.elem_type
            for value in (*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output)
        }
        self.types.update({name: tensor.data_type for name, tensor in self.initializers.items()})

    def constant(self, name: str) -> TensorProto | None:
        if name in self.initializers:
            return self.initializers[name]
        node = self.producer.get(name)
        if node is not None and node.op_type == "Constant":
            return helper.get_attribute_value(node.attribute[0])
        return None

    def operand(self, name: str) -> str:
        """A constant as `dtype[shape]`, an activation as its dtype."""
        tensor = self.constant(name)
        if tensor is not None:
            return f"{dtype_name(tensor.data_type)}{list(tensor.dims)}"
        return dtype_name(self.types.get(name, 0))

    def reader_ops(self, name: str) -> str:
        counts = Counter(node.op_type for node in self.readers.get(name, []))
        return "+".join(f"{count}x{op}" if count > 1 else op for op, count in sorted(counts.items())) or "none"

    def single_reader(self, name: str) -> onnx.NodeProto | None:
        readers = self.readers.get(name, [])
        return readers[0] if len(readers) == 1 else None


def dtype_name(code: int) -> str:
    short = {"FLOAT": "f32", "FLOAT16": "f16", "BFLOAT16": "bf16", "INT64": "i64", "INT8": "i8", "UINT8": "u8"}
    name = TensorProto.DataType.Name(code) if code else "?"
    return short.get(name, name.lower())


def describe(graph: Graph, node: onnx.NodeProto) -> str:
    """`Q(in f16, scale f16[], zp float8e4m3fn[], saturate=default)`; a Cast as `Cast(f32->f16)`."""
    if node.op_type == "Cast":
        target = helper.get_attribute_value(node.attribute[0])
        return f"Cast({dtype_name(graph.types.get(node.input[0], 0))}->{dtype_name(target)})"
    attributes = {attribute.name: helper.get_attribute_value(attribute) for attribute in node.attribute}
    parts = [f"in {graph.operand(node.input[0])}", f"scale {graph.operand(node.input[1])}"]
    parts.append(f"zp {graph.operand(node.input[2])}" if len(node.input) > 2 and node.input[2] else "no zp")
    if node.op_type == "QuantizeLinear":
        parts.append(f"saturate={attributes.get('saturate', 'default')}")
    if "axis" in attributes:
        parts.append(f"axis={attributes['axis']}")
    return f"{'Q' if node.op_type == 'QuantizeLinear' else 'DQ'}({', '.join(parts)})"


@dataclass(frozen=True)
class Norm:
    """The description of one norm's surroundings; norms with equal descriptions are counted together."""

    source: str
    input_chain: str
    # Readers of the tensor the norm squares, where more than the norm's own Pow and Mul read it.
    input_readers: str
    # ReduceMean to the norm's output: every Cast and Q/DQ in place, the inverse root with its dtype, the weight.
    body: str
    output_chain: str

    def line(self) -> str:
        shared = f" (norm input also read: {self.input_readers})" if self.input_readers else ""
        return f"{self.source} -> {self.input_chain or '(direct)'}{shared} -> norm[{self.body}] -> {self.output_chain}"


def input_side(graph: Graph, tensor: str) -> tuple[str, str]:
    """The Cast / Q / DQ nodes between the norm's input and the op that made it, and that op with its readers."""
    chain = []
    node = graph.producer.get(tensor)
    while node is not None and (node.op_type in QDQ or node.op_type == "Cast"):
        chain.append(describe(graph, node))
        node = graph.producer.get(node.input[0])
    if node is None:
        return " -> ".join(reversed(chain)), "graph input"
    source = f"{node.op_type}(out {graph.operand(node.output[0])}; read by {graph.reader_ops(node.output[0])})"
    return " -> ".join(reversed(chain)), source


def output_side(graph: Graph, tensor: str) -> str:
    """The chain from the norm's output through Cast / Q / DQ and head reshapes to the first real readers; a tensor
    with more than one reader ends the chain and lists them."""
    chain = []
    while True:
        readers = graph.readers.get(tensor, [])
        node = readers[0] if len(readers) == 1 else None
        if node is None or not (node.op_type in QDQ or node.op_type == "Cast" or node.op_type in LAYOUT_OPS):
            chain.append(f"[{graph.reader_ops(tensor)}]")
            return " -> ".join(chain)
        chain.append(describe(graph, node) if node.op_type in (*QDQ, "Cast") else node.op_type)
        tensor = node.output[0]


def norm_at(graph: Graph, mean: onnx.NodeProto) -> Norm | None:
    square = graph.producer.get(mean.input[0])
    if square is None or square.op_type not in ("Pow", "Mul"):
        return None
    if square.op_type == "Mul" and square.input[0] != square.input[1]:
        return None
    x = square.input[0]
    body = ["ReduceMean"]
    tensor = mean.output[0]
    expected = ["Add", "Sqrt", ("Reciprocal", "Div")]
    scaled = None
    # Add(eps), Sqrt, the inverse root and Mul(x, r), with Casts and Q/DQ anywhere between; then the weight Mul and
    # Casts. A Q after Mul(x, r) is the output's: the output chain describes it.
    while (reader := graph.single_reader(tensor)) is not None:
        if reader.op_type == "Cast" or (reader.op_type in QDQ and scaled is None):
            body.append(describe(graph, reader))
        elif expected and reader.op_type in (expected[0] if isinstance(expected[0], tuple) else (expected[0],)):
            expected.pop(0)
            step = reader.op_type
            if step == "Add":
                step = f"Add(eps {graph.operand(next(i for i in reader.input if i != tensor))})"
            elif step == "Div":
                numerator = graph.constant(reader.input[0])
                value = onnx.numpy_helper.to_array(numerator).tolist() if numerator is not None else "?"
                step = f"Div({value} {graph.operand(reader.input[0])}, ·) -> {graph.operand(reader.output[0])}"
            elif step == "Reciprocal":
                step = f"Reciprocal -> {graph.operand(reader.output[0])}"
            body.append(step)
        elif not expected and scaled is None and reader.op_type == "Mul":
            scaled = reader
            body.append("Mul(x, r)")
        elif scaled is not None and reader.op_type == "Mul" and any(graph.constant(i) for i in reader.input):
            weight = next(i for i in reader.input if graph.constant(i) is not None)
            body.append(f"Mul(w {graph.operand(weight)})")
        else:
            break
        tensor = reader.output[0]
    if scaled is None:
        return None
    input_chain, source = input_side(graph, x)
    own = {square.name, scaled.name}
    others = [reader for reader in graph.readers.get(x, []) if reader.name not in own]
    input_readers = "+".join(sorted(reader.op_type for reader in others))
    return Norm(source, input_chain, input_readers, " -> ".join(body[1:]), output_side(graph, tensor))


def catalogue(path: Path) -> Counter[Norm]:
    graph = Graph(onnx.load(str(path)))
    norms = (norm_at(graph, node) for node in graph.model.graph.node if node.op_type == "ReduceMean")
    return Counter(norm for norm in norms if norm is not None)


@click.command(help=__doc__, context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("files", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path), help="Also write them here.")
def main(files: tuple[Path, ...], json_path: Path | None) -> None:
    report = {}
    for path in files:
        norms = catalogue(path)
        click.echo(f"{path.name}: {sum(norms.values())} norms")
        for norm, count in norms.most_common():
            click.echo(f"  {count} x {norm.line()}")
        report[path.name] = [{"count": count, **vars(norm)} for norm, count in norms.most_common()]
    if json_path is not None:
        json_path.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
