"""Replace each matched norm, QK pair and add-norm with one plugin node of the contract (trtfuse/contract/nodes.py,
docs/plugin-nodes.md)."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from trtfuse import contract
from trtfuse.contract.codec import NodeFields
from trtfuse.errors import TrtfuseError
from trtfuse.fusion.patterns import AddNormMatch, NormSearch, RmsNormMatch, TakenQuantizer
from trtfuse.fusion.patterns.matches import QkNormRopeMatch, RotaryTable, RotatedNorm
from trtfuse.fusion.patterns.queries import describe, dtype_name, look_through_lossless_casts
from trtfuse.fusion.patterns.search import live_tensors


@dataclass(frozen=True)
class FusedNode:
    """One fused node, as the JSON report lists it; `kind` is its op type (one of contract.FUSED_OPS), `dtype` its
    activations' (for an add-norm D, the dtype it sums in), `quantizers` those a quantized node took in, `rotary` a
    rotary node's rotation."""

    kind: str
    name: str
    replaced: tuple[str, ...]
    params: contract.NormParams
    hidden_sizes: tuple[int, ...]
    dtype: str
    output_dtype: str
    tags: tuple[str, ...]
    quantizers: tuple[TakenQuantizer, ...] = ()
    rotary: contract.RotaryParams | None = None

    def as_dict(self) -> dict:
        entry = {
            "kind": self.kind,
            "name": self.name,
            "replaced": list(self.replaced),
            "epsilon": self.params.epsilon,
            "hidden_sizes": list(self.hidden_sizes),
            "weight_mode": self.params.weight_mode.name,
            "weight_offset": self.params.weight_offset,
            "dtype": self.dtype,
            "output_dtype": self.output_dtype,
            "tags": list(self.tags),
        }
        if self.quantizers:
            entry["quant"] = quantizers_json(self.quantizers)
        if self.rotary is not None:
            entry["rotary"] = rotary_json(self.rotary)
        return entry


def rotary_json(rotary: contract.RotaryParams) -> dict[str, int | str]:
    """A rotation's fields, as the reports list them."""
    return {
        "head_dim": rotary.head_dim,
        "rotary_dim": rotary.rotary_dim,
        "rotation": rotary.rotation.name,
        "layout": rotary.layout.name,
        "output_layout": rotary.output_layout.name,
    }


def quantizers_json(quantizers: tuple[TakenQuantizer, ...]) -> dict[str, dict]:
    """Each stage's quantizer, as the reports list them: its fields and the Q (and DQ) nodes it replaces."""
    return {
        taken.stage.value: {
            "dtype": taken.quantizer.dtype,
            "scale": taken.quantizer.scale,
            "saturate": taken.quantizer.saturate,
            **({"dequant_dtype": taken.quantizer.dequant_dtype} if taken.stage.fake else {}),
            **({"input_dtype": taken.quantizer.input_dtype} if taken.stage.rounds_input else {}),
            "nodes": [describe(node) for node in taken.nodes],
        }
        for taken in quantizers
    }


def output_dtype(match: RmsNormMatch) -> str:
    """The dtype of the match's final tensor; a `y` the graph leaves untyped is a norm ending in x's dtype."""
    return match.output_dtype


class _Names:
    """The names of a graph's tensors and nodes (its subgraphs' too), and those the rewrite gives what it adds: the
    name asked for where the graph holds none such, else with the first free `_N` suffix. So what the rewrite makes
    never takes a name the model uses already (a tensor of its own called `y/quantized`), and the names are the same
    on every run."""

    def __init__(self, graph: gs.Graph) -> None:
        self._tensors: set[str] = set()
        self._nodes: set[str] = set()
        self._collect(graph)

    def _collect(self, graph: gs.Graph) -> None:
        self._tensors.update(tensor.name for tensor in (*graph.inputs, *graph.outputs))
        for node in graph.nodes:
            self._nodes.add(node.name)
            self._tensors.update(tensor.name for tensor in (*node.inputs, *node.outputs))
            for value in node.attrs.values():
                for subgraph in value if isinstance(value, list) else [value]:
                    if isinstance(subgraph, gs.Graph):
                        self._collect(subgraph)

    def tensor(self, base: str) -> str:
        return self._fresh(base, self._tensors)

    def node(self, base: str) -> str:
        return self._fresh(base, self._nodes)

    @staticmethod
    def _fresh(base: str, taken: set[str]) -> str:
        name, count = base, 0
        while name in taken:
            count += 1
            name = f"{base}_{count}"
        taken.add(name)
        return name


def _fields(
    op: contract.FusedOp,
    match: RmsNormMatch,
    hidden_sizes: tuple[int, ...],
    dtype: str | None = None,
    params: contract.NormParams | None = None,
    rotated: RotatedNorm | None = None,
) -> NodeFields:
    """The node's fields for `match`, read in `dtype` with `params` (the match's own unless given: an add-norm reads
    the sum in D), its output dtype the norm's, or its rotation's where the node rotates (`rotated`)."""
    out = output_dtype(match) if rotated is None else rotated.output_dtype
    problem = contract.dtype_pair_problem(dtype or match.dtype, out)
    if problem is not None:
        raise TrtfuseError(f"norm '{match.name}' cannot be one fused node: {problem}")
    rotary = None if rotated is None else rotated.rotary
    return NodeFields(op=op, params=params or match.params, hidden_sizes=hidden_sizes, output_dtype=out, rotary=rotary)


def _quantized(fields: NodeFields, quantizers: tuple[TakenQuantizer, ...]) -> NodeFields:
    """The fields of the quantized op with `quantizers` in their stages; `fields` as they are without any."""
    if not quantizers:
        return fields
    quant = contract.QuantParams(**{taken.stage.value: taken.quantizer for taken in quantizers})
    return replace(fields, op=contract.QUANTIZED_OPS[fields.op.name], quant=quant)


def _node_output(match: RmsNormMatch, y: gs.Variable, x: gs.Tensor, names: _Names) -> gs.Variable:
    """The normalised output the node writes: y, or with an output quantizer the QuantizeLinear's output (FP8 or
    INT8), cut from it. Where the QuantizeLinear read y through a layout op, the node writes y's codes (a new tensor
    of y's shape) and the op, kept, moves them into the QuantizeLinear's output. The Shape nodes that read y (its only
    readers but the quantizer's path) read x instead: the node's input, of y's shape, so no reader of a shape is left
    on a tensor that is gone."""
    taken = next((taken for taken in match.quantizers if taken.output is not None), None)
    if taken is None:
        return y
    quantized = taken.output
    quantized.inputs.clear()
    layout = taken.layout
    if quantized.dtype is None:
        quantized.dtype = contract.QUANT_DTYPE_CODES[taken.quantizer.dtype]
    if quantized.shape is None:
        quantized.shape = (layout.outputs[0] if layout is not None else y).shape
    written = quantized
    if layout is not None:
        written = gs.Variable(names.tensor(f"{y.name}/quantized"), dtype=quantized.dtype, shape=y.shape)
        layout.inputs[0] = written
        layout.outputs[0] = quantized
    taken_in = {id(node) for node in taken.nodes}
    for reader in list(y.outputs):
        if id(reader) not in taken_in:
            for index, operand in enumerate(reader.inputs):
                if operand is y:
                    reader.inputs[index] = x
    return written


def _append_node(
    graph: gs.Graph, fields: NodeFields, name: str, inputs: list[gs.Tensor], outputs: list[gs.Variable]
) -> None:
    """The fused node of `fields`, in the trtfuse domain with the contract's attributes."""
    op = fields.op.name
    attrs = fields.onnx_attributes()
    graph.nodes.append(gs.Node(op, name, attrs=attrs, inputs=inputs, outputs=outputs, domain=contract.ONNX_DOMAIN))


def _check_pair_dtypes(q: RmsNormMatch, k: RmsNormMatch, q_out: str, k_out: str) -> None:
    """q's and k's (input, output) dtypes are one pair: one node reads and writes both."""
    if (q.dtype, q_out) != (k.dtype, k_out):
        raise TrtfuseError(
            f"q/k norms '{q.name}' and '{k.name}' cannot be one fused node: dtypes {q.dtype} -> {q_out} and "
            f"{k.dtype} -> {k_out} differ"
        )


def _onnx_type(dtype: str) -> int:
    """A contract dtype name as an ONNX element type (NumPy has no bfloat16)."""
    return onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype)) if dtype != "bfloat16" else onnx.TensorProto.BFLOAT16


def _graphsurgeon_dtype(dtype: str) -> np.dtype | int:
    """A contract dtype name as onnx-graphsurgeon holds a tensor's dtype: a NumPy dtype, or the ONNX enum of
    bfloat16."""
    return np.dtype(dtype) if dtype != "bfloat16" else _onnx_type(dtype)


def _variable(name: str, dtype: str, shape: object) -> gs.Variable:
    return gs.Variable(name, dtype=_graphsurgeon_dtype(dtype), shape=shape)


def _convert(
    graph: gs.Graph, names: _Names, tensor: gs.Tensor, dtype: str, name: str, out: gs.Variable | None = None
) -> gs.Tensor:
    """`tensor` in `dtype` (as a float ONNX Cast converts it), into `out` when given (else a new tensor named after
    `name`); itself when already so."""
    if out is None and dtype_name(tensor) == dtype:
        return tensor
    if out is None:
        out = _variable(names.tensor(name), dtype, tensor.shape)
    cast = gs.Node("Cast", names.node(f"{name}/Cast"), attrs={"to": _onnx_type(dtype)}, inputs=[tensor], outputs=[out])
    graph.nodes.append(cast)
    return out


def _normalised_input(graph: gs.Graph, names: _Names, match: RmsNormMatch) -> gs.Tensor:
    """x itself, or for a residual norm the sum x + skip (+ bias) that the fused node reads.

    The sum is computed as onnxruntime's SkipSimplifiedLayerNormalization computes it: every operand widened to
    `match.skip_dtype` (float32), added there in the op's order, the norm reading that sum unrounded. The op's sum
    output is the same sum rounded once to x's dtype: Adds in float16 would round after each addition and feed the
    norm a rounded sum (3.4e-4 off in fp16 where check allows 2.8e-4)."""
    if not match.skip_inputs:
        return match.x
    activation = dtype_name(match.x) or match.dtype
    total: gs.Tensor = _convert(graph, names, match.x, match.dtype, f"{match.y.name}/skip_x_{match.dtype}")
    for index, addend in enumerate(match.skip_inputs):
        addend = _convert(graph, names, addend, match.dtype, f"{match.y.name}/skip_addend_{index}_{match.dtype}")
        last = index == len(match.skip_inputs) - 1
        if last and match.skip_sum is not None and activation == match.dtype:
            out = match.skip_sum
            out.inputs.clear()
        else:
            name = names.tensor(f"{match.y.name}/skip_sum_{index}")
            out = gs.Variable(name, dtype=np.dtype(match.dtype), shape=match.x.shape)
        add = gs.Node("Add", names.node(f"{match.name}/skip_add_{index}"), inputs=[total, addend], outputs=[out])
        graph.nodes.append(add)
        total = out
    if match.skip_sum is not None:
        if match.skip_sum.dtype is None:
            match.skip_sum.dtype, match.skip_sum.shape = match.x.dtype, match.x.shape
        if total is not match.skip_sum:
            match.skip_sum.inputs.clear()
            _convert(graph, names, total, activation, f"{match.y.name}/skip_sum_rounded", out=match.skip_sum)
    return total


def _detach_output(match: RmsNormMatch) -> gs.Variable:
    """Cut the final output from the node producing it, so the chain dies and the fused node can own it."""
    y = match.y
    y.inputs.clear()
    if y.dtype is None:
        y.dtype = match.x.dtype
    if y.shape is None:
        y.shape = match.x.shape
    return y


def _weights(*matches: RmsNormMatch) -> list[gs.Tensor]:
    return [match.weight for match in matches if match.params.weight_mode != contract.WeightMode.NONE]


def _rms_norm_node(graph: gs.Graph, names: _Names, match: RmsNormMatch) -> FusedNode:
    fields = _quantized(_fields(contract.RMS_NORM, match, (match.hidden_size,)), match.quantizers)
    op = fields.op.name
    x = _normalised_input(graph, names, match)
    y = _detach_output(match)
    name = names.node(f"{op}/{y.name}")
    _append_node(graph, fields, name, [x, *_weights(match)], [_node_output(match, y, x, names)])
    return _record(op, name, (match,), (match.hidden_size,))


def _add_norm_node(graph: gs.Graph, names: _Names, add: AddNormMatch) -> FusedNode:
    """The residual Add (or a skip op's sum) and its norm as one TrtfuseAddRmsNorm: x and residual are the Add's
    operands in D, h keeps the sum's name (the next residual Add reads it), y the norm's."""
    norm = add.norm
    hidden = (norm.hidden_size,)
    quantizers = add.all_quantizers
    fields = _fields(contract.ADD_RMS_NORM, norm, hidden, dtype=add.dtype, params=add.params)
    fields = _quantized(fields, quantizers)
    roles = contract.ADD_RMS_NORM.activations
    operands = [_operand(graph, names, add, role, operand) for role, operand in zip(roles, add.operands, strict=True)]
    h = _sum_output(graph, names, add, operands[0])
    y = _detach_output(norm)
    name = names.node(f"{fields.op.name}/{y.name}")
    outputs = [_node_output(norm, y, operands[0], names), h]
    _append_node(graph, fields, name, [*operands, *_weights(norm)], outputs)
    return FusedNode(
        kind=fields.op.name,
        name=name,
        replaced=tuple(describe(node) for node in [*add.nodes, *_quantizer_nodes(add.quantizers), *norm.nodes]),
        params=add.params,
        hidden_sizes=hidden,
        dtype=add.dtype,
        output_dtype=fields.output_dtype,
        tags=add.tags,
        quantizers=quantizers,
    )


def _quantizer_nodes(quantizers: tuple[TakenQuantizer, ...]) -> list[gs.Node]:
    """The Q/DQ nodes of the quantizers a match's own nodes do not list (the rsqrt pair is inside the chain)."""
    return [
        node for taken in quantizers if taken.stage.norm_stage is not contract.QuantStage.RSQRT for node in taken.nodes
    ]


def _operand(graph: gs.Graph, names: _Names, add: AddNormMatch, role: str, operand: gs.Tensor) -> gs.Tensor:
    """An Add operand as the node reads it, in D. One without an inferred dtype (a contrib op's output) is declared
    in the one dtype the Add gives all its operands, so every reader of the fused model (check, the lowering, the
    parser) knows it."""
    if operand.dtype is None:
        operand.dtype = _graphsurgeon_dtype(add.operand_dtype)
    return _convert(graph, names, operand, add.dtype, f"{add.norm.y.name}/{role}_{add.dtype}")


def _sum_output(graph: gs.Graph, names: _Names, add: AddNormMatch, x: gs.Tensor) -> gs.Variable:
    """The node's h: the original sum's tensor, cut from its producer, when it is in D. A skip op's 16-bit sum output
    is h rounded once (a Cast), as onnxruntime rounds its float32 sum; a sum nobody read is a new tensor."""
    total = add.total
    if total is not None:
        total.inputs.clear()
        if total.dtype is None:
            # A contrib op's outputs have no inferred type: the skip op's sum has its input's dtype and shape.
            total.dtype, total.shape = add.operands[0].dtype, add.operands[0].shape
        if dtype_name(total) == add.dtype:
            return total
    h = _variable(names.tensor(f"{add.norm.y.name}/residual_sum"), add.dtype, x.shape)
    if total is not None:
        _convert(graph, names, h, dtype_name(total), f"{add.norm.y.name}/residual_sum_rounded", out=total)
    return h


def _qk_norm_node(graph: gs.Graph, names: _Names, q: RmsNormMatch, k: RmsNormMatch) -> FusedNode:
    """The pair as one TrtfuseQkNorm, or, where either norm took quantizers in (its part's stages: q_input, q_rsqrt,
    q_output or the k ones), one TrtfuseQkNormQuant reading each input pair's source and writing each quantized
    output's codes."""
    _check_pair_dtypes(q, k, output_dtype(q), output_dtype(k))
    hidden = (q.hidden_size, k.hidden_size)
    fields = _quantized(_fields(contract.QK_NORM, q, hidden), (*q.quantizers, *k.quantizers))
    outputs = [_node_output(match, _detach_output(match), match.x, names) for match in (q, k)]
    name = names.node(f"{fields.op.name}/{q.y.name}")
    _append_node(graph, fields, name, [q.x, k.x, *_weights(q, k)], outputs)
    return _record(fields.op.name, name, (q, k), hidden)


def _qk_norm_rope_node(graph: gs.Graph, names: _Names, rope: QkNormRopeMatch, tables: _Tables) -> FusedNode:
    """The pair and the rotation after it as one TrtfuseQkNormRope (TrtfuseQkNormRopeQuant where it took the Q of
    a rotated output): the norms' inputs and weights, the cos and sin tables, each output the rotated norm, under the
    name the rotation's result has where no layout op follows (else the norm's, which the layout ops move on)."""
    q, k = rope.q, rope.k
    _check_pair_dtypes(q.norm, k.norm, q.output_dtype, k.output_dtype)
    hidden = (q.norm.hidden_size, k.norm.hidden_size)
    fields = _quantized(_fields(contract.QK_NORM_ROPE, q.norm, hidden, rotated=q), rope.quantizers)
    cos, sin = (tables.table(graph, table, q.rotary) for table in (q.cos, q.sin))
    for side in (q, k):
        if side.normalised is not None:
            # The norm's own output, which the normalised stage's pair read, is gone with it: its Shape readers read
            # the node's input, of its shape.
            _read_instead(look_through_lossless_casts(side.normalised.quantize.inputs[0]), side.norm.x)
    outputs = [_rotated_output(side, names) for side in (q, k)]
    name = names.node(f"{fields.op.name}/{outputs[0].name}")
    _append_node(graph, fields, name, [q.norm.x, k.norm.x, *_weights(q.norm, k.norm), cos, sin], outputs)
    record = _record(fields.op.name, name, (q.norm, k.norm), hidden)
    # Where the node writes [B, H, S, D] itself, the layout ops that moved the result there are gone with it too.
    moved = [node for side in (q, k) if side.rotary.moves_heads for node in side.layout]
    rotations = tuple(describe(node) for side in (q, k) for node in side.nodes) + tuple(map(describe, moved))
    taken = [node for side in (q, k) for node in _quantizer_nodes(side.rotation_quantizers)]
    return replace(
        record,
        replaced=(*record.replaced, *rotations, *(describe(node) for node in taken)),
        output_dtype=fields.output_dtype,
        quantizers=rope.quantizers,
        rotary=q.rotary,
    )


def _rotated_output(side: RotatedNorm, names: _Names) -> gs.Variable:
    """The tensor the node writes for one rotated norm, with the graph rewired around it: the rotation's result (or
    its Q's codes) cut from its producer, which the node writes where no layout ops follow the norm or where it
    writes their [B, H, S, D] itself (`RotaryParams.moves_heads`); else the node writes a new tensor of y's shape
    (`Y/rotated`, or its codes `Y/quantized`) and the layout ops, kept, move it into the result, each tensor between
    them renamed likewise: a name the original gives an unrotated value never holds a rotated one, so what `check`
    compares by name stays the same value. Shape nodes that read a tensor now gone read one of its shape: the node's
    input for y, the result for the rotated tensor."""
    norm, result, layout = side.norm, side.result, side.layout
    result.inputs.clear()
    taken = side.quantizer
    final = result if taken is None else taken.output
    if taken is not None:
        final.inputs.clear()
        if final.dtype is None:
            final.dtype = contract.QUANT_DTYPE_CODES[taken.quantizer.dtype]
        if final.shape is None:
            final.shape = result.shape
        # A Shape of the result reads a tensor of its shape: the codes where the node writes [B, H, S, D], else x.
        _read_instead(result, final if side.rotary.moves_heads else norm.x)
    _read_instead(norm.y, norm.x)
    _read_instead(side.rotated, final)
    if not layout or side.rotary.moves_heads:
        # No layout ops, or the node writes their [B, H, S, D] itself: they go with the rotation.
        return final
    suffix = "rotated" if taken is None else "quantized"
    written = gs.Variable(names.tensor(f"{norm.y.name}/{suffix}"), dtype=final.dtype, shape=norm.y.shape)
    layout[0].inputs[0] = written
    for op in layout[:-1]:
        moved = op.outputs[0]
        moved.name = names.tensor(f"{moved.name}/{suffix}")
        moved.dtype = final.dtype
    layout[-1].outputs[0] = final
    return written


def _read_instead(gone: gs.Tensor, instead: gs.Tensor) -> None:
    """The Shape nodes reading `gone` read `instead`, a tensor of its shape (the matcher let no other reader stay)."""
    for reader in list(gone.outputs):
        if reader.op == "Shape":
            reader.inputs[0] = instead


class _Tables:
    """The node's cos and sin tables, [Bc, S, R], each made once from the graph's own (rewrite's one per model), every
    tensor and node they add named by `names`."""

    def __init__(self, names: _Names) -> None:
        self._made: dict[tuple, gs.Tensor] = {}
        self._names = names

    def table(self, graph: gs.Graph, table: RotaryTable, rotary: contract.RotaryParams) -> gs.Tensor:
        key = (id(table.tensor), table.squeeze, table.unsqueeze, id(table.positions), table.half, rotary.rotation)
        if key not in self._made:
            self._made[key] = self._make(graph, table, rotary)
        return self._made[key]

    def _make(self, graph: gs.Graph, table: RotaryTable, rotary: contract.RotaryParams) -> gs.Tensor:
        tensor = table.tensor
        name = f"trtfuse_rope_table/{tensor.name}"
        if table.squeeze is not None:
            tensor = self._axes_op(graph, "Squeeze", tensor, table.squeeze, f"{name}/squeezed")
        if table.unsqueeze:
            tensor = self._axes_op(graph, "Unsqueeze", tensor, 0, f"{name}/batched")
        if table.positions is not None:
            tensor = self._op(graph, "Gather", [tensor, table.positions], f"{name}/at_positions", {"axis": 0})
        if not table.half:
            return tensor
        if rotary.rotation is contract.Rotation.HALF_SPLIT:
            return self._op(graph, "Concat", [tensor, tensor], f"{name}/full", {"axis": -1})
        column = self._axes_op(graph, "Unsqueeze", tensor, -1, f"{name}/column")
        pairs = self._op(graph, "Concat", [column, column], f"{name}/pairs", {"axis": -1})
        shape = gs.Constant(self._names.tensor(f"{name}/shape"), np.array([0, 0, rotary.rotary_dim], dtype=np.int64))
        return self._op(graph, "Reshape", [pairs, shape], f"{name}/interleaved")

    def _op(
        self, graph: gs.Graph, op: str, inputs: list[gs.Tensor], name: str, attrs: dict | None = None
    ) -> gs.Variable:
        """One node `op` of `inputs`, its output of the first input's dtype; both named after `name`, made unique."""
        out = gs.Variable(self._names.tensor(name), dtype=inputs[0].dtype)
        graph.nodes.append(gs.Node(op, self._names.node(name), attrs or {}, inputs, [out]))
        return out

    def _axes_op(self, graph: gs.Graph, op: str, tensor: gs.Tensor, axis: int, name: str) -> gs.Variable:
        """Squeeze or Unsqueeze of one axis, the axes an input from opset 13 on, an attribute before."""
        if graph.opset >= 13:
            axes = gs.Constant(self._names.tensor(f"{name}/axes"), np.array([axis], dtype=np.int64))
            return self._op(graph, op, [tensor, axes], name)
        return self._op(graph, op, [tensor], name, {"axes": [axis]})


def _record(kind: str, name: str, matches: tuple[RmsNormMatch, ...], hidden: tuple[int, ...]) -> FusedNode:
    first = matches[0]
    return FusedNode(
        kind=kind,
        name=name,
        replaced=tuple(
            describe(node) for match in matches for node in [*match.nodes, *_quantizer_nodes(match.quantizers)]
        ),
        params=first.params,
        hidden_sizes=hidden,
        dtype=first.dtype,
        output_dtype=output_dtype(first),
        tags=tuple(dict.fromkeys(tag for match in matches for tag in match.tags)),
        quantizers=tuple(taken for match in matches for taken in match.quantizers),
    )


def _import_trtfuse_domain(graph: gs.Graph) -> None:
    """The one writer of the trtfuse opset import: fuse exports the graph with the imports this leaves."""
    if graph.import_domains is None:
        graph.import_domains = [onnx.helper.make_opsetid("", graph.opset)]
    if all(opset.domain != contract.ONNX_DOMAIN for opset in graph.import_domains):
        graph.import_domains.append(onnx.helper.make_opsetid(contract.ONNX_DOMAIN, contract.ONNX_DOMAIN_VERSION))


def rewrite(graph: gs.Graph, search: NormSearch) -> list[FusedNode]:
    """Put one contract node in place of each match, pair and add-norm; remove what the rewrite made dead; toposort.
    In place.

    Only live matches are rewritten: a norm whose result reaches no graph output (`search.dead`, each also a near
    miss) stays as the original wrote it, as does all code that was dead already (with whatever it reads), so a model
    with nothing to fuse comes out as it went in. So every fused node is in the file written, and fuse reports what
    inspect found. Every tensor and node it adds has a name of its own in the graph (`_Names`)."""
    live = live_tensors(graph)
    dead = [node for node in graph.nodes if not any(id(tensor) in live for tensor in node.outputs)]
    names = _Names(graph)
    fused = [_rms_norm_node(graph, names, match) for match in search.matches]
    fused += [_add_norm_node(graph, names, add) for add in search.add_norms]
    fused += [_qk_norm_node(graph, names, pair.q, pair.k) for pair in search.qk_norm_pairs]
    tables = _Tables(names)
    fused += [_qk_norm_rope_node(graph, names, rope, tables) for rope in search.qk_norm_ropes]
    kept = live_tensors(graph, also=[tensor for node in dead for tensor in node.outputs])
    graph.nodes = [node for node in graph.nodes if any(id(tensor) in kept for tensor in node.outputs)]
    graph.toposort()
    if fused:
        _import_trtfuse_domain(graph)
    return fused
