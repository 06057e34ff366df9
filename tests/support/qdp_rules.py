"""tensorrt.plugin's reader of QDP functions, restated for the tests: what `@trtp.register`, `@trtp.autotune` and
`@trtp.aot_impl` refuse, rule by rule, with stand-ins for its types (a class in TensorDesc's role, and so on).

Restated from NVIDIA/TensorRT `python/packaging/bindings_wheel/tensorrt/plugin/_validate.py` (P below), identical at
v10.9.0 and v11.1: `_parse_register_inputs` (:75-168), `_parse_register_return` (:171-201), `_validate_aot_impl`
(:282-394) and `_validate_autotune` (:397-475); the type names of AutoTuneCombination strings from `_str_to_data_type`
(P/_utils.py:40-48). Each check raises ValueError (or TypeError, where NVIDIA's `issubclass` would) as the original
does, with its line in the message. NVIDIA's code is not copied: the rules are written out in this project's words.
"""

from __future__ import annotations

import inspect
import types
import typing
from dataclasses import dataclass
from typing import Any

SERIALIZABLE_BUILTIN_TYPES = (int, float, bytes, bool, str)  # P/_validate.py:30
DISALLOWED_ATTR_NAMES = {"outputs", "stream", "tactic"}  # :51
ACCEPTED_KINDS = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)  # :93


@dataclass(frozen=True)
class StandIns:
    """The classes in the roles of tensorrt.plugin's TensorDesc, AutoTuneCombination, KernelLaunchParams, SymExprs."""

    tensor_desc: type
    auto_tune_combination: type
    kernel_launch_params: type
    sym_exprs: type


@dataclass(frozen=True)
class Registered:
    """What `register` records of a register function (PluginDef: input_tensor_names, input_attrs, num_outputs)."""

    tensor_names: list[str]
    input_attrs: dict[str, Any]
    num_outputs: int


def parse_register(function: Any, roles: StandIns) -> Registered:
    """`_parse_register_inputs` (non-lazy registration) then `_parse_register_return`."""
    tensor_names: list[str] = []
    input_attrs: dict[str, Any] = {}
    saw_attribute = False
    signature = inspect.signature(function)
    for index, (name, param) in enumerate(signature.parameters.items()):
        if param.kind not in ACCEPTED_KINDS:
            raise ValueError(f"{name}: not positional-or-keyword or keyword-only (:93)")
        if param.annotation is inspect.Parameter.empty:
            raise ValueError(f"{name}: no type annotation (:102)")
        if param.default is not inspect.Parameter.empty:
            raise ValueError(f"{name}: a default value (:108)")
        # issubclass raises TypeError for an annotation that is not a class (a string, a generic alias).
        if issubclass(param.annotation, roles.tensor_desc):
            if saw_attribute:
                raise ValueError(f"{name}: a TensorDesc after an attribute (:115)")
            tensor_names.append(name)
            continue
        if index == 0:
            raise ValueError(f"{name}: an attribute first (:125)")
        if name in DISALLOWED_ATTR_NAMES:
            raise ValueError(f"{name}: a disallowed attribute name (:130)")
        if param.annotation not in SERIALIZABLE_BUILTIN_TYPES:
            # NumPy array annotations are accepted there too; trtfuse uses none (docs/plugins.md, "Attribute types").
            raise ValueError(f"{name}: {param.annotation} is not a serializable attribute type (:135-153)")
        saw_attribute = True
        input_attrs[name] = param.annotation
    returned = signature.return_annotation
    if returned is inspect.Parameter.empty:
        raise ValueError("no return annotation (:176)")
    if typing.get_origin(returned) is not tuple:
        if not inspect.isclass(returned) or not issubclass(returned, roles.tensor_desc):
            raise ValueError(f"return {returned}: not TensorDesc or a tuple of them (:182)")
        outputs = 1
    else:
        for arg in typing.get_args(returned):
            if not issubclass(arg, roles.tensor_desc):
                raise ValueError(f"return {returned}: not TensorDesc or a tuple of them (:194)")
        outputs = len(typing.get_args(returned))
    return Registered(tensor_names, input_attrs, outputs)


def _attribute_names(function: Any, registered: Registered, roles: StandIns, what: str) -> list[str]:
    """The loop _validate_aot_impl and _validate_autotune share (:289-324, :405-436): annotated parameters are
    checked by role; the attribute names, in the function's order."""
    names = []
    for name, param in inspect.signature(function).parameters.items():
        annotation = param.annotation
        if annotation is inspect.Parameter.empty:
            if name in registered.input_attrs:
                names.append(name)
            continue
        if name == "outputs":
            if typing.get_origin(annotation) is not tuple:
                raise ValueError(f"{what}: 'outputs' is {annotation}, not a tuple (:292, :408)")
            for arg in typing.get_args(annotation):
                if not issubclass(arg, roles.tensor_desc):
                    raise ValueError(f"{what}: 'outputs' holds {arg} (:298, :414)")
        elif name == "tactic" and what == "aot_impl":
            if not issubclass(annotation, int):
                raise ValueError("aot_impl: 'tactic' is not an int (:303)")
        elif issubclass(annotation, roles.tensor_desc):
            if name not in registered.tensor_names:
                raise ValueError(f"{what}: unexpected tensor '{name}' (:306, :419)")
        else:
            if name not in registered.input_attrs:
                raise ValueError(f"{what}: unexpected attribute '{name}' (:311, :424)")
            if annotation != registered.input_attrs[name]:
                raise ValueError(f"{what}: '{name}' annotated unlike its registration (:316, :428)")
            names.append(name)
    return names


def _check_schema(function: Any, registered: Registered, names: list[str], tail: str, what: str) -> None:
    """The parameter names must spell (tensors, the attributes named in registration order, tail) (:326-341,
    :438-453)."""
    chosen = [name for name in registered.input_attrs if name in names]
    expected = f"({', '.join([*registered.tensor_names, *chosen, *tail.split(', ')])})"
    given = f"({', '.join(inspect.signature(function).parameters)})"
    if given != expected:
        raise ValueError(f"{what}: signature {given} is not the schema {expected} (:338, :450)")


def validate_aot_impl(function: Any, registered: Registered, roles: StandIns) -> list[str]:
    """`_validate_aot_impl`: the attribute names aot_impl declares."""
    names = _attribute_names(function, registered, roles, "aot_impl")
    _check_schema(function, registered, names, "outputs, tactic", "aot_impl")
    returned = inspect.signature(function).return_annotation
    if returned is inspect.Parameter.empty:
        raise ValueError("aot_impl: no return annotation (:345)")
    args = typing.get_args(returned)
    if typing.get_origin(returned) is not tuple or len(args) != 4:
        raise ValueError(f"aot_impl: return {returned} is not a 4-tuple (:354, :361)")
    for index in (0, 1):
        union = typing.get_origin(args[index]) in (typing.Union, types.UnionType)
        for arg in typing.get_args(args[index]) if union else (args[index],):
            if arg is not str and arg is not bytes:
                raise ValueError(f"aot_impl: return item {index} is {arg}, not str or bytes (:366-386)")
    if not issubclass(args[2], roles.kernel_launch_params):
        raise ValueError(f"aot_impl: return item 2 is {args[2]} (:388)")
    if not issubclass(args[3], roles.sym_exprs):
        raise ValueError(f"aot_impl: return item 3 is {args[3]} (:391)")
    return names


def validate_autotune(function: Any, registered: Registered, roles: StandIns) -> list[str]:
    """`_validate_autotune`: the attribute names autotune declares."""
    names = _attribute_names(function, registered, roles, "autotune")
    _check_schema(function, registered, names, "outputs", "autotune")
    returned = inspect.signature(function).return_annotation
    if returned is inspect.Parameter.empty:
        return names
    if typing.get_origin(returned) is not list:
        if not inspect.isclass(returned) or not issubclass(returned, roles.auto_tune_combination):
            raise ValueError(f"autotune: return {returned} (:460)")
    else:
        for arg in typing.get_args(returned):
            if not issubclass(arg, roles.auto_tune_combination):
                raise ValueError(f"autotune: return {returned} (:470)")
    return names


def type_name_is_read(name: str, data_type_names: set[str]) -> bool:
    """Whether `_str_to_data_type` (P/_utils.py:40-48) reads `name` of an AutoTuneCombination: FP32, FP16, or the name
    of a trt.DataType member."""
    return name in ("FP32", "FP16") or name in data_type_names
