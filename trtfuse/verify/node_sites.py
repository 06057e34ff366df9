"""Where each fused node stands in its original, and the two small models `check` judges each node with.

A fused node takes the place of a chain of the original: it reads tensors the original computes too (its x and
residual, q and k, or what the QuantizeLinear it took in read) and its outputs take the place of tensors of the
original (the norm's y, or the codes of the QuantizeLinear after it; an add-norm's sum). So each node can be judged
where it stands, on the original's own values of what it reads, whatever the nodes before it computed:

- the candidate model: a copy of the node, with the few ops the rewrite put around it (the widening Casts of its
  operands, a skip op's sum, a Cast or a layout op that moves an output into the original's tensor), its plugin
  nodes lowered to standard ops (`fusion.lowering`); for a quantized output also the original's own QuantizeLinear
  applied to the value the node quantized;
- the reference model: the original's own ops from the tensors the node reads to those it replaces, in float32 with
  the quantizers kept where the graph rounds (`widening.widen_to_float32(keep_quantizers=True)`); none for an
  original that computes in float32, whose own values are the reference.

Every node's copy lives under a prefix of its own (`NodeSite.prefix`) in one model of each kind, fed under that
prefix: no node reads another's values.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace

import onnx
from onnx import helper

from trtfuse import contract
from trtfuse.errors import TrtfuseError, first_line
from trtfuse.fusion.fused_nodes import PluginNode, node_label, plugin_nodes
from trtfuse.fusion.lowering import lower_fused_nodes, quantizer_input, stage_tensors
from trtfuse.fusion.patterns.quant import LAYOUT_OPS
from trtfuse.model.interface import elem_type_name, value_types
from trtfuse.model.onnx_file import DEFAULT_DOMAINS, LoadedModel
from trtfuse.verify.widening import is_reduced_precision, widen_to_float32

PREFIX = "trtfuse_check"
# Ops the rewrite may put between a node's output and the original's tensor it replaces: they move or convert the
# values, computing none (a sum rounded to another dtype, an INT8 layout op moving the node's codes).
_MOVES = ("Cast", "Identity", *LAYOUT_OPS)
# How far a copy may reach: the rewrite puts a few ops around a node, and a norm's chain is a dozen ops; a QK-norm
# with its rotation is two of each, and TorchScript's and optimum's rotate_half slice at bounds computed from Shape
# ops: 78-85 of the original's ops from q and k to the rotated outputs (Qwen3, OLMo2; Constants counted). A fused
# model whose node is farther from the original's tensors is judged only end to end.
_CANDIDATE_OPS = 16
_REFERENCE_OPS = 160
_PARTNER_DEPTH = 4
# How many ops up from a rotation's sum its normalised pair may stand (the products' pairs, Muls, Casts, a partial
# rotation's Slice and Concat between).
_STAGE_DEPTH = 8


class _Unjudged(Exception):
    """Why a node (or one output of it) cannot be judged where it stands."""


@dataclass(frozen=True)
class JudgedOutput:
    """One output of a fused node, judged on the original's `tensor` it takes the place of.

    `value` is the original's tensor judged against the reference: `tensor` itself, or for a quantized output
    (`quantizer`, the original's QuantizeLinear that wrote `tensor`) the y that QuantizeLinear quantized. The other
    names are the candidate model's outputs: `candidate`, the node's `tensor`; `candidate_value`, its `value` (in the
    original's layout); for a quantized output `codes`, the codes the node wrote (before any op moved them),
    `quantized`, the value the node quantized (in the node's layout), and `requantized`, the original's
    QuantizeLinear applied to `quantized`, which `codes` must equal.

    A rotation stage (the normalised one, a product) is judged as an output of its own: `tensor` is the codes of the
    original's QuantizeLinear on the normalised y or the product (`value`), `candidate` the node's codes in float32
    and the original's layout, and `dequantized` / `original_dequantized` the two DequantizeLinear values; a product
    after a normalised stage names it (`normalised`) and the original's operand its Mul multiplies the normalised
    side by (`table`: cos or sin): where that stage's codes moved, the products' may move as far as that move times
    the table allows. A part whose inverse root is quantized has an rsqrt stage, judged where the original's
    QuantizeLinear on r reads; the stages after it name it (`rsqrt`): a row's r' may be a step of its own grid from
    the original's (the graph computing r otherwise), and every value of the row moves with it, as far as the
    largest relative move of r' allows. The
    rotated output the products sum into lists them (`products`): its value is judged within what their steps allow
    (docs/cli.md, "Each fused node")."""

    tensor: str
    value: str
    candidate: str
    candidate_value: str
    quantizer: str | None = None
    code_dtype: str | None = None
    codes: str | None = None
    requantized: str | None = None
    quantized: str | None = None
    dequantized: str | None = None
    original_dequantized: str | None = None
    products: tuple[JudgedOutput, ...] = ()
    normalised: JudgedOutput | None = None
    table: str | None = None
    rsqrt: JudgedOutput | None = None

    @property
    def is_stage(self) -> bool:
        """A rotation stage's codes, judged in steps of its grid from the original's."""
        return self.original_dequantized is not None


@dataclass(frozen=True)
class NodeSite:
    """A fused node (`name`, `op`) where it stands: the original's tensors its copies read (`reads`; the reference's
    in `reference_reads`), the outputs judged, and what of it is not judged, with the reason (`notes`)."""

    name: str
    op: str
    prefix: str
    reads: tuple[str, ...] = ()
    reference_reads: tuple[str, ...] = ()
    outputs: tuple[JudgedOutput, ...] = ()
    notes: tuple[str, ...] = ()

    def fed(self, tensor: str) -> str:
        return f"{self.prefix}{tensor}"


@dataclass(frozen=True)
class NodeModels:
    """Every fused node's site, the candidate and reference models (None: nothing to judge; no reference: the
    original computes in float32), each with the path its weights resolve against, and the original's tensors its
    run must give besides its outputs."""

    sites: tuple[NodeSite, ...]
    candidate: LoadedModel | None
    reference: LoadedModel | None
    exposed: tuple[str, ...]

    @property
    def judged(self) -> tuple[NodeSite, ...]:
        return tuple(site for site in self.sites if site.outputs)


class _Graph:
    """One graph's tensors by name: producers, readers, initializers, inputs, every name, element types."""

    def __init__(self, model: onnx.ModelProto) -> None:
        graph = model.graph
        self.model = model
        self.producers = {output: node for node in graph.node for output in node.output if output}
        self.readers: dict[str, list[onnx.NodeProto]] = {}
        for node in graph.node:
            for name in node.input:
                self.readers.setdefault(name, []).append(node)
        self.initializers = {tensor.name: tensor for tensor in graph.initializer}
        self.inputs = {value.name for value in graph.input} - set(self.initializers)
        self.names = set(self.producers) | self.inputs | set(self.initializers)
        self.order = {id(node): index for index, node in enumerate(graph.node)}
        self.outputs = {value.name for value in graph.output}
        _, self.types = value_types(model)


@dataclass
class _Copy:
    """The nodes (by their place in the graph they come from), initializers and fed inputs of one site's copy in a
    model of one kind."""

    prefix: str
    nodes: dict[int, onnx.NodeProto] = field(default_factory=dict)
    initializers: dict[str, onnx.TensorProto] = field(default_factory=dict)
    reads: dict[str, None] = field(default_factory=dict)
    value_info: list[onnx.ValueInfoProto] = field(default_factory=list)

    def name(self, tensor: str) -> str:
        return f"{self.prefix}{tensor}" if tensor else ""

    def inputs(self, graph: _Graph, declared: _Graph) -> list[onnx.ValueInfoProto]:
        """The fed tensors as graph inputs, each of its dtype in `graph` (else as `declared` declares it: the fusion
        declares a contrib op's output it reads, which shape inference leaves untyped)."""
        inputs = []
        for tensor in self.reads:
            elem_type = graph.types.get(tensor) or declared.types.get(tensor)
            if not elem_type:
                raise _Unjudged(f"the original's '{tensor}' has no known dtype")
            inputs.append(helper.make_tensor_value_info(self.name(tensor), elem_type, None))
        return inputs

    def copy_up_to(
        self, tensor: str, graph: _Graph, stop: Callable[[str], bool], rename: Mapping[str, str], limit: int
    ) -> None:
        """Copy the ops of `graph` that compute `tensor`, back to the tensors `stop` takes (and records)."""
        if not tensor or stop(tensor):
            return
        producer = graph.producers.get(tensor)
        if producer is None:
            raise _Unjudged(f"'{tensor}' is computed from nothing the original holds")
        order = graph.order[id(producer)]
        if order in self.nodes:
            return
        for name in producer.input:
            self.copy_up_to(name, graph, stop, rename, limit)
        self.add(producer, rename, order, limit)

    def ordered(self) -> list[onnx.NodeProto]:
        return [node for _, node in sorted(self.nodes.items())]

    def add(self, node: onnx.NodeProto, rename: Mapping[str, str], order: int, limit: int) -> None:
        """A copy of `node` whose tensors are named as `rename` says (else under the prefix)."""
        if any(
            attribute.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for attribute in node.attribute
        ):
            raise _Unjudged(f"it reaches {node.op_type} '{node_label(node)}', which holds a subgraph")
        if len(self.nodes) >= limit:
            raise _Unjudged(f"more than {limit} ops lie between it and the original's tensors")
        copied = onnx.NodeProto()
        copied.CopyFrom(node)
        copied.name = self.name(node_label(node) or f"node{order}")
        copied.input[:] = [rename.get(name, self.name(name)) for name in node.input]
        copied.output[:] = [self.name(name) for name in node.output]
        self.nodes[order] = copied


def node_models(original: LoadedModel, fused: LoadedModel) -> NodeModels:
    """Every fused node of `fused` where it stands in `original`, and the models that judge it there. A node that
    cannot be judged where it stands is listed with the reason (`NodeSite.notes`), and judged end to end only."""
    source, target = _Graph(original.model), _Graph(fused.model)
    sites: list[NodeSite] = []
    candidates: list[onnx.ModelProto] = []
    references: list[tuple[NodeSite, _Copy]] = []
    for index, plugin in enumerate(plugin_nodes(fused.model, fused.path)):
        prefix = f"{PREFIX}/{index}/"
        try:
            site, candidate, after = _candidate(plugin, prefix, source, target)
            reference = _reference(site, source)
            reference.value_info.extend(reference.inputs(source, target))
            candidates.append(_candidate_model(fused, site, candidate, after, source, target))
        except (_Unjudged, TrtfuseError) as why:
            reason = first_line(why) if isinstance(why, TrtfuseError) else str(why)
            note = f"not judged where it stands: {reason}"
            sites.append(NodeSite(node_label(plugin.node), plugin.op.name, prefix, notes=(note,)))
            continue
        site = replace(site, reference_reads=tuple(reference.reads))
        sites.append(site)
        references.append((site, reference))
    if not candidates:
        return NodeModels(tuple(sites), None, None, ())
    reference_model = None
    if is_reduced_precision(original.model):
        reference_model = LoadedModel(_reference_model(original, references), original.path)
    exposed = {
        name: None
        for site, _ in references
        for name in [
            *site.reads,
            *site.reference_reads,
            *(t for out in site.outputs for t in (out.tensor, out.value, out.original_dequantized, out.table) if t),
        ]
        if name not in source.inputs
    }
    return NodeModels(tuple(sites), LoadedModel(_merged(candidates), fused.path), reference_model, tuple(exposed))


def _candidate(plugin: PluginNode, prefix: str, source: _Graph, target: _Graph) -> tuple[NodeSite, _Copy, _Copy]:
    """The node's site, its copy in the candidate model (before lowering) and the ops that go after the lowering
    (each quantized output's QuantizeLinear of the original, reading the value the node quantized)."""
    copy = _Copy(prefix)
    after = _Copy(prefix)
    node = plugin.node
    shared = {name: name for name in target.initializers}

    def held(tensor: str) -> bool:
        """A weight of the fused model or a tensor of the original, recorded: no op of the fused graph to copy."""
        if tensor in target.initializers:
            copy.initializers[tensor] = target.initializers[tensor]
        elif tensor in source.initializers:
            copy.initializers[copy.name(tensor)] = _renamed(source.initializers[tensor], copy.name(tensor))
        elif tensor in source.names:
            copy.reads[tensor] = None
        else:
            return False
        return True

    def read(tensor: str) -> None:
        """Copy what computes `tensor` in the fused graph, down to the original's tensors (fed) and weights."""
        copy.copy_up_to(tensor, target, held, shared, _CANDIDATE_OPS)

    for name in node.input:
        read(name)
    copy.add(node, shared, target.order[id(node)], _CANDIDATE_OPS)
    for output in node.output:
        declared = next((value for value in target.model.graph.value_info if value.name == output), None)
        if declared is not None:
            renamed = onnx.ValueInfoProto()
            renamed.CopyFrom(declared)
            renamed.name = copy.name(output)
            copy.value_info.append(renamed)
    outputs, notes = [], []
    for position, output in enumerate(node.output):
        if output not in source.names and output not in target.outputs and not target.readers.get(output):
            continue  # a value nothing reads (an add-norm's sum at the last norm): nothing depends on it
        try:
            outputs.extend(_judged_outputs(plugin, position, output, copy, after, read, source, target))
        except _Unjudged as why:
            notes.append(f"output '{output}' not judged where it stands: {why}")
    if not outputs:
        raise _Unjudged("; ".join(notes) or "it has no output")
    site = NodeSite(node_label(node), plugin.op.name, prefix, tuple(copy.reads), (), tuple(outputs), tuple(notes))
    return site, copy, after


def _judged_outputs(
    plugin: PluginNode,
    position: int,
    output: str,
    copy: _Copy,
    after: _Copy,
    read: Callable[[str], None],
    source: _Graph,
    target: _Graph,
) -> list[JudgedOutput]:
    """Output `position` of the node, followed through the ops that move it into a tensor of the original; before
    it, the product stages of its rotation (`_products`)."""
    tensor, moved = output, []
    while tensor not in source.names:
        readers = [
            node for node in target.readers.get(tensor, []) if node.op_type in _MOVES and node.input[0] == tensor
        ]
        if not readers or len(moved) == 2:
            raise _Unjudged("no tensor of the original holds it")
        mover = readers[0]
        for name in mover.input[1:]:
            read(name)
        copy.add(mover, {name: name for name in target.initializers}, target.order[id(mover)], _CANDIDATE_OPS)
        moved.append(mover)
        tensor = mover.output[0]
    code_dtype = plugin.output_dtype(position)
    if code_dtype not in contract.QUANT_DTYPE_CODES:
        judged = JudgedOutput(tensor, tensor, copy.name(tensor), copy.name(tensor))
        pending = moved
    else:
        quantize = source.producers.get(tensor)
        if quantize is None or quantize.op_type != "QuantizeLinear" or quantize.domain not in DEFAULT_DOMAINS:
            raise _Unjudged(f"the original's '{tensor}' is written by no QuantizeLinear")
        value, walked = _quantized_value(quantize, {node_label(mover) for mover in moved}, source)
        # The layout ops the original applies before its QuantizeLinear's input move the node's value too (a rotated
        # output's Transpose stands before the rotation in the original): judged in the original's layout.
        pending = [mover for mover in moved if node_label(mover) not in walked]
        quantized = quantizer_input(copy.name(output))
        judged = JudgedOutput(
            tensor,
            value,
            copy.name(tensor),
            _moved(quantized, pending, copy, after, target),
            node_label(quantize),
            code_dtype,
            copy.name(output),
            _requantize(quantize, quantized, tensor, after, source),
            quantized,
        )
    rsqrt = _rsqrt(plugin, position, judged.value, copy, after, source)
    normalised = _normalised(plugin, position, judged.value, copy, after, source)
    if normalised is not None:
        normalised = replace(normalised, rsqrt=rsqrt)
    products = _products(plugin, position, judged.value, pending, copy, after, source, target, normalised)
    products = tuple(replace(product, rsqrt=rsqrt) for product in products)
    stages = [stage for stage in (rsqrt, normalised) if stage is not None]
    if not products:
        return [*stages, judged]
    return [*stages, *products, replace(judged, products=products)]


def _moved(value: str, movers: list[onnx.NodeProto], copy: _Copy, after: _Copy, target: _Graph) -> str:
    """`value` of the candidate moved by a copy of each of `movers` in turn (their other operands as `copy` holds
    them), into the original's layout; `value` itself where there are none."""
    for mover in movers:
        moved = f"{value}/{node_label(mover)}"
        copied = onnx.NodeProto()
        copied.CopyFrom(mover)
        copied.name = moved
        operands = [name if not name or name in target.initializers else copy.name(name) for name in mover.input[1:]]
        copied.input[:] = [value, *operands]
        copied.output[:] = [moved]
        after.nodes[len(after.nodes)] = copied
        value = moved
    return value


def _products(
    plugin: PluginNode,
    position: int,
    value: str,
    movers: list[onnx.NodeProto],
    copy: _Copy,
    after: _Copy,
    source: _Graph,
    target: _Graph,
    normalised: JudgedOutput | None,
) -> tuple[JudgedOutput, ...]:
    """The product stages of the part whose rotated output is `position`, each judged where the original's
    QuantizeLinear on that product reads (its rotation's sum is the original's `value`), after the part's
    `normalised` stage where it has one; none where the part has no product stages or rotates part of each head
    row."""
    rotary = plugin.fields.rotary
    quant = plugin.fields.part_quant(plugin.op.output_parts[position]) if rotary else None
    if rotary is None or quant is None or quant.cos_product is None or rotary.rotary_dim < rotary.head_dim:
        # A partial rotation's products cover R of y's D elements: it is judged as any output (the matcher takes
        # one only where y is the graph's bit for bit).
        return ()
    pairs = _rotation_pairs(value, source)
    stages = (contract.QuantStage.COS_PRODUCT, contract.QuantStage.SIN_PRODUCT)
    activation = plugin.output_activations[position][1]
    return tuple(
        replace(
            _stage_output(plugin, position, stage, pairs[stage], movers, copy, after, source, target),
            normalised=normalised,
            table=None if normalised is None else _product_table(pairs[stage][0], activation, source),
        )
        for stage in stages
    )


def _product_table(quantize: onnx.NodeProto, activation: str, source: _Graph) -> str | None:
    """The operand of the original's Mul whose product `quantize` quantizes that is not computed from the part's
    `activation` (the cos or sin the normalised side is multiplied by), where the original's run gives it (None for
    a constant: no export has one there, and its products' moved rows then go unbounded, as before)."""
    product = _quantized_value(quantize, set(), source)[0]
    mul = source.producers.get(product)
    if mul is None or mul.op_type != "Mul":
        return None
    tables = [name for name in mul.input if not _computed_from(name, activation, source)]
    if len(tables) != 1:
        return None
    producer = source.producers.get(tables[0])
    computed = producer is not None and producer.op_type != "Constant"
    return tables[0] if computed or tables[0] in source.inputs else None


def _stage_output(
    plugin: PluginNode,
    position: int,
    stage: contract.QuantStage,
    pair: tuple[onnx.NodeProto, onnx.NodeProto],
    movers: list[onnx.NodeProto],
    copy: _Copy,
    after: _Copy,
    source: _Graph,
    target: _Graph,
) -> JudgedOutput:
    """Rotation stage `stage` of the part whose output is `position`, judged where the original's QuantizeLinear ->
    DequantizeLinear `pair` reads: the node's value, codes and dequantized value (`stage_tensors`) moved by `movers`
    into the original's layout."""
    quantize, dequantize = pair
    quant = plugin.fields.part_quant(plugin.op.output_parts[position])
    names = stage_tensors(copy.name(plugin.node.output[position]), stage)
    codes = f"{names.codes}/fp32"
    after.nodes[len(after.nodes)] = helper.make_node(
        "Cast", [names.codes], [codes], to=onnx.TensorProto.FLOAT, name=codes
    )
    return JudgedOutput(
        quantize.output[0],
        _quantized_value(quantize, set(), source)[0],
        _moved(codes, movers, copy, after, target),
        _moved(names.value, movers, copy, after, target),
        node_label(quantize),
        quant.at(stage).dtype,
        names.codes,
        _requantize(quantize, names.value, quantize.output[0], after, source),
        names.value,
        _moved(names.dequantized, movers, copy, after, target),
        dequantize.output[0],
    )


def _normalised(
    plugin: PluginNode, position: int, value: str, copy: _Copy, after: _Copy, source: _Graph
) -> JudgedOutput | None:
    """The normalised stage of the part whose rotated output is `position`, judged where the original's
    QuantizeLinear on the norm's y reads (the pair stands before any layout op, so in the node's own layout); None
    where the part has none. The pair is the first one up from the rotation's sum (the original's `value`), past
    the products' pairs, whose QuantizeLinear reads a value computed from the part's activation."""
    quant = plugin.fields.part_quant(plugin.op.output_parts[position])
    if quant is None or quant.normalised is None:
        return None
    activation = plugin.output_activations[position][1]
    products = () if quant.cos_product is None else _rotation_pairs(value, source).values()
    passed = {id(node) for pair in products for node in pair}
    pair = _pair_above(
        value,
        source,
        _STAGE_DEPTH,
        lambda dequantize, reads: id(dequantize) not in passed and _computed_from(reads, activation, source),
    )
    if pair is None:
        raise _Unjudged(
            f"no QuantizeLinear -> DequantizeLinear pair on the norm's output leads to the original's '{value}'"
        )
    stage = contract.QuantStage.NORMALISED
    return _stage_output(plugin, position, stage, pair, [], copy, after, source, source)


def _rsqrt(
    plugin: PluginNode, position: int, value: str, copy: _Copy, after: _Copy, source: _Graph
) -> JudgedOutput | None:
    """The rsqrt stage of a rotary node's part whose rotated output is `position`, judged where the original's
    QuantizeLinear on the inverse root reads (per row, before any layout op: in the node's own layout); None where
    the part has none (or the node no rotation: its outputs are judged bit for bit or as values, not in steps). The
    pair is the one up from the rotation's sum (the original's `value`) whose QuantizeLinear reads a value computed
    from the part's activation only through a reduction."""
    quant = plugin.fields.part_quant(plugin.op.output_parts[position])
    if plugin.fields.rotary is None or quant is None or quant.rsqrt is None:
        return None
    activation = plugin.output_activations[position][1]

    def on_the_root(_dequantize: onnx.NodeProto, reads: str) -> bool:
        return _computed_from(reads, activation, source) and not _computed_from(reads, activation, source, _REDUCTIONS)

    pair = _pair_above(value, source, 4 * _STAGE_DEPTH, on_the_root)
    if pair is None:
        raise _Unjudged(
            f"no QuantizeLinear -> DequantizeLinear pair on the inverse root leads to the original's '{value}'"
        )
    return _stage_output(plugin, position, contract.QuantStage.RSQRT, pair, [], copy, after, source, source)


def _pair_above(
    value: str, source: _Graph, depth: int, accept: Callable[[onnx.NodeProto, str], bool]
) -> tuple[onnx.NodeProto, onnx.NodeProto] | None:
    """The first QuantizeLinear -> DequantizeLinear pair of the original within `depth` ops up from `value` (breadth
    first) that `accept`s (given the DequantizeLinear and what its QuantizeLinear reads); None where none does."""
    frontier: list[str] = [value]
    for _ in range(depth):
        producers = [node for node in (source.producers.get(name) for name in frontier) if node is not None]
        for node in producers:
            quantize = source.producers.get(node.input[0]) if node.op_type == "DequantizeLinear" else None
            if quantize is not None and quantize.op_type == "QuantizeLinear" and accept(node, quantize.input[0]):
                return quantize, node
        frontier = list(dict.fromkeys(name for node in producers for name in node.input if name))
    return None


def _rotation_pairs(value: str, source: _Graph) -> dict[contract.QuantStage, tuple[onnx.NodeProto, onnx.NodeProto]]:
    """The QuantizeLinear -> DequantizeLinear pairs on the two products the original's Add `value` sums, by stage:
    the sin product's is the one whose Mul reads the rotated half (a Neg a few layout ops up), read off the
    original's graph, not the node's fields."""
    add = source.producers.get(value)
    pairs = {}
    for operand in add.input if add is not None and add.op_type == "Add" else ():
        dequantize = source.producers.get(operand)
        quantize = None if dequantize is None else source.producers.get(dequantize.input[0])
        if dequantize is None or dequantize.op_type != "DequantizeLinear" or quantize is None:
            break
        if quantize.op_type != "QuantizeLinear":
            break
        turned = _reads_negated(quantize.input[0], source)
        pairs[contract.QuantStage.SIN_PRODUCT if turned else contract.QuantStage.COS_PRODUCT] = (quantize, dequantize)
    if len(pairs) != 2:
        raise _Unjudged(f"the original's '{value}' is no sum of a cos and a sin product, each quantized")
    return pairs


# Ops whose output element depends on many elements of a row: a value computed from an activation only through one
# of them (a norm's inverse root) is computed from the row, not element by element.
_REDUCTIONS = ("ReduceMean", "ReduceSum", "ReduceSumSquare", "ReduceL2")


def _computed_from(tensor: str, activation: str, source: _Graph, stops: tuple[str, ...] = ()) -> bool:
    """Whether the original computes `tensor` from the values of `activation` (not only its shape) within twice
    `_STAGE_DEPTH` ops up (a norm's chain), not through any op of `stops`."""
    frontier = [tensor]
    for _ in range(2 * _STAGE_DEPTH):
        if activation in frontier:
            return True
        producers = [source.producers.get(name) for name in frontier]
        frontier = list(
            dict.fromkeys(
                name
                for node in producers
                if node is not None and node.op_type != "Shape" and node.op_type not in stops
                for name in node.input
                if name
            )
        )
    return activation in frontier


# The ops between the rotated half's Neg and the Mul by sin (the partner built by Concat, perhaps reshaped or cast).
_PARTNER_OPS = ("Cast", "Concat", "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Slice")


def _reads_negated(product: str, source: _Graph) -> bool:
    """Whether the Mul computing `product` reads a value made from a Neg through a few partner ops."""
    mul = source.producers.get(product)
    if mul is None or mul.op_type != "Mul":
        return False
    frontier = list(mul.input)
    for _ in range(_PARTNER_DEPTH):
        producers = [source.producers.get(name) for name in frontier]
        if any(node is not None and node.op_type == "Neg" for node in producers):
            return True
        frontier = [
            name for node in producers if node is not None and node.op_type in _PARTNER_OPS for name in node.input
        ]
    return False


def _quantized_value(quantize: onnx.NodeProto, moved: set[str], source: _Graph) -> tuple[str, set[str]]:
    """The original's y that `quantize` quantizes: its input, seen through Casts to float32 of a value rounded as it
    is and through the layout ops the fused model moves the node's codes with (`moved`, by name); and the names of
    those layout ops it was seen through."""
    tensor = quantize.input[0]
    producer = source.producers.get(tensor)
    walked = set()
    while producer is not None and (
        (producer.op_type in LAYOUT_OPS and node_label(producer) in moved) or _widens(producer, source)
    ):
        if producer.op_type in LAYOUT_OPS:
            walked.add(node_label(producer))
        tensor = producer.input[0]
        producer = source.producers.get(tensor)
    return tensor, walked


def _widens(node: onnx.NodeProto, graph: _Graph) -> bool:
    """A Cast to float32 of a 16-bit or float32 value: it changes no value."""
    if node.op_type != "Cast" or helper.get_node_attr_value(node, "to") != onnx.TensorProto.FLOAT:
        return False
    return elem_type_name(graph.types.get(node.input[0], 0)) in contract.ACTIVATION_DTYPES


def _requantize(quantize: onnx.NodeProto, value: str, tensor: str, after: _Copy, source: _Graph) -> str:
    """A copy of the original's `quantize` reading the candidate's `value` (float32) in the dtype the original's
    reads; its scale and zero point copied from the original (constants only). Returns the copy's output."""
    read_as = source.types.get(quantize.input[0], 0)
    if elem_type_name(read_as) not in contract.ACTIVATION_DTYPES:
        raise _Unjudged(f"the original's QuantizeLinear '{node_label(quantize)}' reads a value of unknown dtype")
    operand = value
    if read_as != onnx.TensorProto.FLOAT:
        operand = after.name(f"{tensor}/requantize_input")
        after.nodes[len(after.nodes)] = helper.make_node("Cast", [value], [operand], to=read_as, name=operand)
    inputs = [operand, *(_original_constant(name, after, source) for name in quantize.input[1:])]
    requantized = after.name(f"{tensor}/requantized")
    copied = onnx.NodeProto()
    copied.CopyFrom(quantize)
    copied.name = requantized
    copied.input[:] = inputs
    copied.output[:] = [requantized]
    after.nodes[len(after.nodes)] = copied
    return requantized


def _original_constant(tensor: str, after: _Copy, source: _Graph) -> str:
    """A scale or zero point of the original, copied under the site's prefix: an initializer, or what Constant
    nodes and ops on them compute."""
    if not tensor:
        return ""
    name = after.name(f"original/{tensor}")
    if tensor in source.initializers:
        after.initializers[name] = _renamed(source.initializers[tensor], name)
        return name
    producer = source.producers.get(tensor)
    if producer is None or any(attribute.type == onnx.AttributeProto.GRAPH for attribute in producer.attribute):
        raise _Unjudged(f"the original's '{tensor}' is no constant")
    inputs = [_original_constant(operand, after, source) for operand in producer.input]
    copied = onnx.NodeProto()
    copied.CopyFrom(producer)
    copied.name = name
    copied.input[:] = inputs
    copied.output[:] = [after.name(f"original/{output}") for output in producer.output]
    if len(after.nodes) >= _CANDIDATE_OPS:
        raise _Unjudged(f"the original's '{tensor}' is no constant")
    after.nodes[len(after.nodes)] = copied
    return name


def _renamed(tensor: onnx.TensorProto, name: str) -> onnx.TensorProto:
    renamed = onnx.TensorProto()
    renamed.CopyFrom(tensor)
    renamed.name = name
    return renamed


def _reference(site: NodeSite, source: _Graph) -> _Copy:
    """The original's ops from what the node reads (and the model's inputs) to the values its outputs are judged on,
    copied under the site's prefix; the original's initializers shared."""
    copy = _Copy(site.prefix)
    shared = {name: name for name in source.initializers}
    stops = set(site.reads) | source.inputs

    def held(tensor: str) -> bool:
        if tensor in source.initializers:
            copy.initializers[tensor] = source.initializers[tensor]
        elif tensor in stops:
            copy.reads[tensor] = None
        else:
            return False
        return True

    for output in site.outputs:
        copy.copy_up_to(output.value, source, held, shared, _REFERENCE_OPS)
    return copy


def _model(
    like: onnx.ModelProto,
    nodes: list[onnx.NodeProto],
    inputs: list[onnx.ValueInfoProto],
    initializers: Mapping[str, onnx.TensorProto],
) -> onnx.ModelProto:
    """A model of `nodes` with the opsets and local functions of `like`; its outputs are added later."""
    graph = helper.make_graph(nodes, "trtfuse_check_nodes", inputs, [], list(initializers.values()))
    model = helper.make_model(graph, opset_imports=list(like.opset_import), ir_version=like.ir_version)
    model.functions.extend(like.functions)
    return model


def _add_outputs(model: onnx.ModelProto, names: Iterable[str]) -> None:
    """Each of `names` as an output, its type left for the runtime to infer."""
    model.graph.output.extend(onnx.ValueInfoProto(name=name) for name in dict.fromkeys(names) if name)


def _candidate_model(
    fused: LoadedModel, site: NodeSite, copy: _Copy, after: _Copy, source: _Graph, target: _Graph
) -> onnx.ModelProto:
    """One node's copy, lowered, with the original's QuantizeLinear copies after it; its outputs those `site` names."""
    model = _model(fused.model, copy.ordered(), copy.inputs(source, target), copy.initializers)
    model.graph.value_info.extend(copy.value_info)
    lowered = lower_fused_nodes(model, fused.path)
    lowered.graph.node.extend(after.ordered())
    lowered.graph.initializer.extend(after.initializers.values())
    names = ("candidate", "codes", "candidate_value", "requantized", "quantized", "dequantized")
    _add_outputs(lowered, (getattr(out, name) for out in site.outputs for name in names))
    return lowered


def _merged(models: list[onnx.ModelProto]) -> onnx.ModelProto:
    """One model holding every one of `models` (their names apart under their prefixes; shared weights once)."""
    merged = onnx.ModelProto()
    merged.CopyFrom(models[0])
    names = {tensor.name for tensor in merged.graph.initializer}
    for model in models[1:]:
        graph = model.graph
        merged.graph.node.extend(graph.node)
        merged.graph.input.extend(graph.input)
        merged.graph.output.extend(graph.output)
        merged.graph.value_info.extend(graph.value_info)
        merged.graph.initializer.extend(tensor for tensor in graph.initializer if tensor.name not in names)
        names.update(tensor.name for tensor in graph.initializer)
    return merged


def _reference_model(original: LoadedModel, judged: list[tuple[NodeSite, _Copy]]) -> onnx.ModelProto:
    """The original's subgraph of every judged node, in float32 with its quantizers kept."""
    nodes = [node for _, copy in judged for node in copy.ordered()]
    inputs = [value for _, copy in judged for value in copy.value_info]
    initializers = {name: tensor for _, copy in judged for name, tensor in copy.initializers.items()}
    model = _model(original.model, nodes, inputs, initializers)
    _add_outputs(model, (site.fed(out.value) for site, _ in judged for out in site.outputs))
    return widen_to_float32(model, keep_quantizers=True)
