"""The layers of one engine profile as a graph of tensors, and what each layer is to the fold check: a GEMM, a plugin,
a reformat, a quantize or dequantize left standing, or a layer that only moves a tensor.

A producer's output and its consumers' input carry the same tensor name, across Myelin and non-Myelin layers alike
(FORMAT.md §4), so the graph is built from the names alone. What the layer types mean is read from real TensorRT 8.x
and 10.x files; which types run a GEMM, and how a standalone (de)quantize shows, is FORMAT.md §5 and §8.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from trtfuse.engine.layer_info import FP8, INT8, Layer, LayerTensor

# Layer types (or ParameterTypes) that run a matrix product: Myelin's `gemm` (TensorRT >= 9), TensorRT 8.2's
# `MatrixMultiply`, convolution runners (an ONNX Gemm / FC runs as a 1x1 convolution) and cuBLAS / CASK GEMM
# runners. Matched in lower case, as words inside the type.
_GEMM_WORDS = ("gemm", "matrixmultiply", "convolution", "fullyconnected")
# A Myelin `kgen` named `_gemm_mha_v2...` is fused attention: its GEMMs read their operands themselves.
_ATTENTION_KERNEL = re.compile(r"^_gemm_mha")
# Operand types in a GEMM tactic's name (`sm90_xmma_gemm_f16f16_f16f16_f16_...`, `..._i8i8_i8i32_f32_...`,
# `..._e4m3bf16_...`): a quantized operand, or two float operands.
_TACTIC_QUANTIZED = {FP8: re.compile(r"e4m3|fp8"), INT8: re.compile(r"i8|int8")}
_TACTIC_FLOAT_PAIR = re.compile(r"_(?:f16|bf16|f32|tf32)(?:f16|bf16|f32|tf32)_")
# Layers that only move or convert a float tensor on its way to a GEMM: TensorRT's reformats and shuffles, and Myelin
# kernels whose name lists layout ops only (`__myl_Resh_...`, `__myl_CastReshCast_...`; FORMAT.md §3).
_MOVING_KINDS = ("Reformat", "Shuffle", "NoOp")
_MYELIN_OPS = re.compile(r"^__myl_((?:[A-Z][a-z]+)+)_")
_LAYOUT_OPS = frozenset({"Resh", "Tran", "Cast", "Copy"})
QUANTIZE = "QuantizeLinear"
# The ONNX ops a standalone (de)quantize kernel may run: the Q/DQ and what only moves or converts data.
_STANDALONE_OPS = frozenset({QUANTIZE, "DequantizeLinear", "Cast", "Reshape", "Transpose", "Squeeze", "Unsqueeze"})


def is_gemm(layer: Layer) -> bool:
    """Whether the layer runs a GEMM that reads its operands itself (a quantized operand folded into it)."""
    kinds = f"{layer.layer_type} {layer.parameter_type or ''}".lower()
    return any(word in kinds for word in _GEMM_WORDS) or bool(_ATTENTION_KERNEL.match(layer.base_name))


def is_plugin(layer: Layer) -> bool:
    """A plugin layer by its type: `PluginV2` is real, `PluginV3` a guess, so any type starting `Plugin`."""
    return layer.layer_type.lower().startswith("plugin")


def is_noop(layer: Layer) -> bool:
    return layer.layer_type == "NoOp"


def is_reformat(layer: Layer) -> bool:
    """A format or type copy TensorRT inserted (`Origin: REFORMAT`, or a Reformat without an origin)."""
    return "Reformat" in (layer.layer_type, layer.parameter_type) and layer.origin != "QDQ"


def _sides(layer: Layer) -> tuple[bool, bool, bool, bool]:
    inputs, outputs = layer.inputs, layer.outputs
    return (
        any(tensor.quantized for tensor in inputs),
        any(tensor.floating for tensor in inputs),
        any(tensor.quantized for tensor in outputs),
        any(tensor.floating for tensor in outputs),
    )


def qdq_role(layer: Layer, onnx_ops: Mapping[str, str]) -> str | None:
    """ "quantize" or "dequantize" for a Q or DQ left standing as a layer of its own: a Reformat of origin QDQ (as
    TensorRT 8.x shows a Q it did not fuse; "qdq" where its tensors' types do not say which), a Scale layer with a
    quantized tensor on one side only (trex's linter rule), or a Myelin kgen with a quantized tensor on one side only
    that runs no ONNX node but Q/DQ and data movement (by `onnx_ops`, node name -> op type; a kgen that also computes,
    a rotary embedding after a DQ, is no standalone dequantize). No real file shows a standalone (de)quantize kgen.
    None for anything else."""
    kgen = layer.layer_type == "kgen"
    if not (layer.origin == "QDQ" or layer.kind == "Scale" or kgen):
        return None
    if kgen and any(onnx_ops.get(node, QUANTIZE) not in _STANDALONE_OPS for node in layer.onnx_nodes):
        return None
    quantized_in, float_in, quantized_out, float_out = _sides(layer)
    if quantized_in and float_out and not float_in and not quantized_out:
        return "dequantize"
    if quantized_out and float_in and not quantized_in and not float_out:
        return "quantize"
    return "qdq" if layer.origin == "QDQ" else None


def neighbour_role(layer: Layer, onnx_ops: Mapping[str, str]) -> str | None:
    """What a layer next to a node is to the report: "reformat" (a copy TensorRT inserted, whatever types it
    converts), a standing quantize / dequantize (`qdq_role`), or None."""
    return "reformat" if is_reformat(layer) else qdq_role(layer, onnx_ops)


def tactic_agrees(tactic: str | None, dtype: str) -> bool | None:
    """Whether a GEMM tactic's name says it reads `dtype` operands: True where it names them (`e4m3`, `i8`), False
    where it names two float operands (`f16f16`), None where it says neither (no tactic, an opaque name)."""
    if not tactic:
        return None
    lowered = tactic.lower()
    if _TACTIC_QUANTIZED[dtype].search(lowered):
        return True
    return False if _TACTIC_FLOAT_PAIR.search(lowered) else None


class LayerGraph:
    """The layers of one profile, by the tensors they produce and consume; `onnx_ops` gives the op type of each ONNX
    node of the model the engine was built from (by name), where known."""

    def __init__(self, layers: Sequence[Layer], onnx_ops: Mapping[str, str] | None = None) -> None:
        self.layers = tuple(layers)
        self.onnx_ops = dict(onnx_ops or {})
        self._producers: dict[str, list[Layer]] = defaultdict(list)
        self._consumers: dict[str, list[Layer]] = defaultdict(list)
        for layer in self.layers:
            for tensor in layer.outputs:
                self._producers[tensor.name].append(layer)
            for tensor in dict.fromkeys(tensor.name for tensor in layer.inputs):
                self._consumers[tensor].append(layer)

    def producers(self, tensor: str) -> tuple[Layer, ...]:
        return tuple(self._producers.get(tensor, ()))

    def consumers(self, tensor: str) -> tuple[Layer, ...]:
        return tuple(self._consumers.get(tensor, ()))

    def role(self, layer: Layer) -> str | None:
        """`neighbour_role` of a layer of this graph."""
        return neighbour_role(layer, self.onnx_ops)

    def readers(self, tensor: str) -> tuple[Layer, ...]:
        """The layers reading `tensor`, looking through NoOp layers (which TensorRT leaves between a producer and
        its consumer, e.g. a copied squeeze)."""
        return self._through_noops(tensor, downstream=True)

    def writers(self, tensor: str) -> tuple[Layer, ...]:
        """The layers writing `tensor`, looking through NoOp layers."""
        return self._through_noops(tensor, downstream=False)

    def _through_noops(self, tensor: str, downstream: bool) -> tuple[Layer, ...]:
        found: list[Layer] = []
        pending, seen = [tensor], {tensor}
        while pending:
            name = pending.pop()
            for layer in self.consumers(name) if downstream else self.producers(name):
                if not is_noop(layer):
                    if layer not in found:
                        found.append(layer)
                    continue
                following = [item for item in _names(layer.outputs if downstream else layer.inputs) if item not in seen]
                seen.update(following)
                pending.extend(following)
        return tuple(found)


def _names(tensors: Iterable[LayerTensor]) -> list[str]:
    return [tensor.name for tensor in tensors]


@dataclass(frozen=True)
class Standing:
    """A layer that reads a quantized tensor and writes a float one where a GEMM should have read it (a dequantize
    or a reformat left standing), with the GEMM layers its float output reaches."""

    layer: Layer
    role: str
    gemms: tuple[Layer, ...]


@dataclass(frozen=True)
class Reach:
    """Where a quantized tensor goes in the engine: the GEMM layers that read it (or a move of its codes) themselves,
    the layers that turn it into a float tensor, and the layers that only moved its codes on the way (a Shuffle, a
    reformat of the same type)."""

    gemms: tuple[Layer, ...]
    standing: tuple[Standing, ...]
    moves: tuple[Layer, ...]


def _moves_codes(layer: Layer, dtype: str) -> bool:
    """A layer that is no GEMM and writes the quantized codes on in the same type (a Shuffle, a same-type reformat, a
    Myelin reshape kernel)."""
    return bool(layer.outputs) and all(tensor.dtype == dtype for tensor in layer.outputs)


def quantized_reach(graph: LayerGraph, tensor: str, dtype: str) -> Reach:
    """Follow the quantized `tensor` (of `dtype`) from its producer through the layers that only move its codes, to
    the GEMMs reading it and the layers that turn it into a float tensor."""
    gemms: list[Layer] = []
    standing: list[Standing] = []
    moves: list[Layer] = []
    pending, seen = [tensor], {tensor}
    while pending:
        for layer in graph.readers(pending.pop()):
            if is_gemm(layer):
                gemms.append(layer)
            elif _moves_codes(layer, dtype):
                moves.append(layer)
                pending.extend(name for name in _names(layer.outputs) if name not in seen)
                seen.update(_names(layer.outputs))
            else:
                role = graph.role(layer) or layer.layer_type or "layer"
                standing.append(Standing(layer, role, _float_reach(graph, layer)))
    return Reach(tuple(dict.fromkeys(gemms)), tuple(standing), tuple(moves))


def _moves_floats(layer: Layer) -> bool:
    """A layer that only moves or converts a float tensor (a reformat, a shuffle, a Myelin layout kernel)."""
    if layer.kind in _MOVING_KINDS or layer.layer_type in _MOVING_KINDS:
        return True
    ops = _MYELIN_OPS.match(layer.base_name)
    return ops is not None and set(re.findall(r"[A-Z][a-z]+", ops.group(1))) <= _LAYOUT_OPS


def _float_reach(graph: LayerGraph, start: Layer) -> tuple[Layer, ...]:
    """The GEMM layers the float outputs of `start` reach directly or through layers that only move them (each
    tensor visited once)."""
    gemms: list[Layer] = []
    pending = [tensor.name for tensor in start.outputs]
    seen = set(pending)
    while pending:
        for layer in graph.readers(pending.pop()):
            if is_gemm(layer):
                gemms.append(layer)
            elif _moves_floats(layer):
                following = [tensor.name for tensor in layer.outputs if tensor.floating and tensor.name not in seen]
                seen.update(following)
                pending.extend(following)
    return tuple(dict.fromkeys(gemms))
