"""One Python creator per op of the contract (`contract.OPS`), by op name: the plain ops' own classes, and for
each quantized op (`contract.quantized`) its plain op's classes with the op swapped.

A quantized op has its plain op's tensors, launch and lifecycle; what differs is carried by the node's fields, which
`NormPlugin` reads from `NodeFields` (the quantizers into the kernel spec, the output stage's dtype for the
normalised outputs). So its classes are subclasses that set `OP` and nothing else.
"""

from __future__ import annotations

from trtfuse.contract import OPS, FusedOp
from trtfuse.plugins.python.add_rms_norm import AddRmsNormPluginCreator
from trtfuse.plugins.python.base import NormPlugin, NormPluginCreator
from trtfuse.plugins.python.qk_norm import QkNormPluginCreator, QkNormRopePluginCreator
from trtfuse.plugins.python.rms_norm import RmsNormPluginCreator

_PLAIN = {
    creator.PLUGIN.OP.name: creator
    for creator in (RmsNormPluginCreator, QkNormPluginCreator, AddRmsNormPluginCreator, QkNormRopePluginCreator)
}


def _creator_of(op: FusedOp) -> type[NormPluginCreator]:
    if op.base is None:
        return _PLAIN[op.name]
    plain = _PLAIN[op.base]
    stem = plain.PLUGIN.__name__.removesuffix("Plugin")
    plugin: type[NormPlugin] = type(
        f"{stem}QuantPlugin",
        (plain.PLUGIN,),
        {"OP": op, "__module__": __name__, "__doc__": f"{op.name}: {plain.PLUGIN.__name__} with its quantizers."},
    )
    return type(f"{stem}QuantPluginCreator", (plain,), {"PLUGIN": plugin, "__module__": __name__})


CREATORS: dict[str, type[NormPluginCreator]] = {name: _creator_of(op) for name, op in OPS.items()}
