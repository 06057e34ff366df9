"""What a model's inputs and outputs are for generation, and the feed of each step.

The roles come from `trtfuse.model.dims`, as `check`'s feeds do: the token ids (`input_ids`), the attention mask (all
ones over past + new tokens), the position ids (counting from the past), the cache inputs with the outputs that
return them (`past_key_values.N.key` <- `present.N.key`), and the length inputs genai's GroupQueryAttention exports
may have (`past_sequence_length`, `total_sequence_length`, `seqlens_k` = total - 1). genai's exports without length
inputs compute them from the mask's shape and sum, so the same feed drives them. Generation runs one sequence: batch 1.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper

from trtfuse.errors import Choice, OptionError, TrtfuseError
from trtfuse.model.dims import (
    Bound,
    DimExpressionError,
    DimRole,
    ModelDims,
    model_dims,
    position_warning,
    stated_positions,
)

# Generation feeds one sequence.
BATCH = 1
LOGITS = "logits"
# Prefixes that name a cache tensor, as inputs (`past_key_values.0.key`) and outputs (`present.0.key`) spell them.
_CACHE_PREFIX = re.compile(r"^(past_key_values|past_key_value|past|present_key_values|present)[._]?", re.IGNORECASE)
NO_CACHE_HINT = "export it with a KV cache (models/export.py --cache, or optimum's --task text-generation-with-past)"


@dataclass(frozen=True)
class CachePair:
    """A cache input and the output that returns it, one step longer, for the next step."""

    past: str
    present: str


@dataclass(frozen=True)
class GenerationInterface:
    """The inputs and outputs generation feeds and reads; `source` names the model in errors."""

    source: str
    reading: ModelDims
    token_input: str
    mask_input: str | None
    position_input: str | None
    caches: tuple[CachePair, ...]
    logits: str | None
    vocabulary: Bound | None
    dtypes: Mapping[str, np.dtype]
    output_names: tuple[str, ...]
    # Where a present comes out in another dtype than its cache input takes (optimum's fp16 Gemma3 returns some
    # layers' presents in float32): it is cast back, as any caller must, and this says so.
    cast_notes: tuple[str, ...] = ()

    @property
    def has_cache(self) -> bool:
        return bool(self.caches)

    @property
    def max_positions(self) -> Bound | None:
        return self.reading.max_total

    def check_drivable(self, use_cache: bool) -> None:
        """One line for a model generation cannot drive: no logits, or no cache without recompute mode."""
        if self.logits is None:
            outputs = ", ".join(self.output_names) or "none"
            raise TrtfuseError(
                f"{self.source}: no logits output (outputs: {outputs}); generation needs the next-token logits"
            )
        if use_cache and not self.has_cache:
            raise OptionError(
                "no-cache",
                f"{self.source}: the model has no KV cache (no past_key_values inputs); run it with ",
                Choice("no-cache"),
                f" (each step runs the whole sequence), or {NO_CACHE_HINT}",
            )

    def check_prompt(self, prompt: Sequence[int], steps: int, use_cache: bool = True) -> None:
        """The prompt and step count the model can take: ids inside the vocabulary (and the token input's integer
        type), as many ids per step as the token input's shape takes, and every position the steps feed (prompt +
        steps - 1: the last token is not fed back) inside the model's position limit. Nothing is built per step: a
        huge step count costs no memory here."""
        if not prompt:
            raise OptionError("prompt-ids", "the prompt is empty; give token ids with ", Choice("prompt-ids"))
        if steps < 1:
            raise OptionError("steps", f"{steps} steps: generation takes at least 1 step")
        low, high = min(prompt), max(prompt)
        limits = np.iinfo(self.dtypes[self.token_input])
        if low < limits.min or high > limits.max:
            bad = low if low < limits.min else high
            raise OptionError(
                "prompt-ids",
                f"prompt id {bad} does not fit input {self.token_input!r} of {self.source}, which takes "
                f"{self.dtypes[self.token_input].name} ids ({limits.min} to {limits.max}); give smaller ids with ",
                Choice("prompt-ids"),
            )
        vocabulary = self.vocabulary
        if low < 0 or (vocabulary is not None and high >= vocabulary.value):
            bad = low if low < 0 else high
            size = f"{vocabulary.value} ids ({vocabulary.reason})" if vocabulary else "non-negative ids"
            raise OptionError(
                "prompt-ids",
                f"prompt id {bad} is outside the vocabulary of {self.source}: it takes {size}; give ids from 0 "
                f"to {vocabulary.value - 1 if vocabulary else 'the vocabulary size - 1'} with ",
                Choice("prompt-ids"),
            )
        bound = self.max_positions
        positions = fed_positions(len(prompt), steps)
        if bound is not None and positions > bound.value:
            raise OptionError(
                "prompt-ids",
                f"a prompt of {_count(len(prompt), 'id')} and {_count(steps, 'step')} feed {positions} positions, "
                f"more than {self.source} holds ({bound.reason}); shorten ",
                Choice("prompt-ids"),
                " or ask for fewer steps",
            )
        self._check_tokens_per_step(len(prompt), steps, use_cache)

    def _check_tokens_per_step(self, prompt_length: int, steps: int, use_cache: bool) -> None:
        """Each step's token count against the token input's shape (a static `[1, 8]` takes 8 ids, a decode-only
        `[batch, 1]` one). Its dims are affine in the tokens and past fed, so the first, second and last steps
        stand for all of them."""
        fed = [(prompt_length, 0)]
        if steps > 1 and use_cache:
            fed += [(1, prompt_length), (1, prompt_length + steps - 2)]
        elif steps > 1:
            fed += [(prompt_length + 1, 0), (prompt_length + steps - 1, 0)]
        for step, (tokens, past) in zip((1, 2, steps), fed, strict=False):
            taken = math.prod(self._shape(self.token_input, self._symbol_values(tokens, past)))
            if taken == tokens:
                continue
            value = next(v for v in self.reading.inputs if v.name == self.token_input)
            dims = ", ".join(d.dim_param or str(d.dim_value) for d in value.type.tensor_type.shape.dim)
            what = f"the prompt's {tokens}" if step == 1 else f"{tokens}"
            remedy = (
                ["give a prompt of ", _count(taken, "id"), " with ", Choice("prompt-ids")]
                if step == 1
                else ["ask for 1 step"]
            )
            raise OptionError(
                "prompt-ids",
                f"{self.source}: input {self.token_input!r} [{dims}] takes {_count(taken, 'token id')} per step, but "
                f"step {step} feeds {what}; ",
                *remedy,
            )

    def position_warning(self, prompt_length: int, steps: int) -> str:
        """'' unless the steps feed more positions than the model was trained for (`model.dims.position_warning`)."""
        what = f"{self.source}: a prompt of {_count(prompt_length, 'id')} and {_count(steps, 'step')} feed"
        return position_warning(self.reading, fed_positions(prompt_length, steps), what)

    def feed(
        self, tokens: Sequence[int], past: int, cache: Mapping[str, np.ndarray] | None = None
    ) -> dict[str, np.ndarray]:
        """The feed of one step: `tokens` after `past` cached ones, the cache from the step before (`cache`, by
        input name) or, at past 0, empty; every other input sized from its dims."""
        values = self._symbol_values(len(tokens), past)
        feed: dict[str, np.ndarray] = {}
        for value in self.reading.inputs:
            name = value.name
            dtype = self.dtypes[name]
            if name == self.token_input:
                feed[name] = np.asarray(tokens, dtype=dtype).reshape(self._shape(name, values))
            elif name in self.reading.cache_inputs:
                if cache is not None and name in cache:
                    feed[name] = cache[name]
                elif past == 0:
                    feed[name] = np.zeros(self._shape(name, values), dtype=dtype)
                else:
                    raise TrtfuseError(f"{self.source}: no cache for input {name!r} at past {past}")
            elif name in self.reading.length_inputs:
                feed[name] = np.full(self._shape(name, values), self._length(name, past, len(tokens)), dtype=dtype)
            elif name == self.mask_input:
                feed[name] = np.ones(self._shape(name, values), dtype=dtype)
            elif name == self.position_input:
                shape = self._shape(name, values)
                feed[name] = np.broadcast_to(np.arange(past, past + shape[-1]), shape).astype(dtype)
            else:
                raise TrtfuseError(f"{self.source}: generation does not know what to feed input {name!r}")
        return feed

    def feed_shapes(self, tokens: int, past: int) -> dict[str, tuple[int, ...]]:
        """The shape of every input at a step of `tokens` after `past`, without making the arrays."""
        values = self._symbol_values(tokens, past)
        return {value.name: self._shape(value.name, values) for value in self.reading.inputs}

    def _symbol_values(self, tokens: int, past: int) -> dict[str, int]:
        values = {symbol: bound.value for symbol, bound in self.reading.fixed.items()}
        by_role = {DimRole.BATCH: BATCH, DimRole.TOKENS: tokens, DimRole.PAST: past, DimRole.TOTAL: past + tokens}
        values.update({symbol: by_role[role] for symbol, role in self.reading.roles.items()})
        return values

    def _shape(self, name: str, values: Mapping[str, int]) -> tuple[int, ...]:
        value = next(v for v in self.reading.inputs if v.name == name)
        shape = []
        for axis, (dim, expression) in enumerate(
            zip(value.type.tensor_type.shape.dim, self.reading.expressions[name], strict=True)
        ):
            if dim.HasField("dim_value"):
                shape.append(dim.dim_value)
                continue
            if expression is None:
                raise TrtfuseError(
                    f"{self.source}: input {name!r} dim {axis} is an unnamed dynamic dim; cannot size it"
                )
            try:
                shape.append(expression.evaluate(values))
            except DimExpressionError as error:
                raise TrtfuseError(
                    f"{self.source}: input {name!r} dim {axis} ({expression.text!r}): {error}; generation sizes "
                    "batch, sequence, past and total dims only"
                ) from None
        return tuple(shape)

    def _length(self, name: str, past: int, tokens: int) -> int:
        if name.lower().startswith("seqlens_k"):
            return past + tokens - 1
        return past if self.reading.length_inputs[name] is DimRole.PAST else past + tokens


def fed_positions(prompt_length: int, steps: int) -> int:
    """The positions a generation feeds: the prompt, then each generated token but the last (it is not fed back)."""
    return prompt_length + steps - 1


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}" if number == 1 else f"{number} {noun}s"


def generation_interface(model: onnx.ModelProto, source: str, positions: int | None = None) -> GenerationInterface:
    """Read the model's generation interface; an input it cannot fill is one line naming it. `positions` states
    the positions the model was trained for (`dims.stated_positions`)."""
    reading = stated_positions(model_dims(model), positions)
    if reading.batch is not None and reading.batch.value != BATCH:
        raise TrtfuseError(
            f"{source}: generation runs one sequence (batch 1), but the model allows only batch "
            f"{reading.batch.value} ({reading.batch.reason})"
        )
    dtypes = {value.name: _numpy_dtype(value, source) for value in reading.inputs}
    others = [
        value
        for value in reading.inputs
        if value.name not in reading.cache_inputs and value.name not in reading.length_inputs
    ]
    integer = [value for value in others if _is_integer(dtypes[value.name])]
    masks = [value.name for value in others if "mask" in value.name.lower()]
    positions = [value.name for value in integer if "position" in value.name.lower()]
    token_candidates = [value.name for value in integer if value.name not in masks and value.name not in positions]
    token_input = "input_ids" if "input_ids" in token_candidates else None
    if token_input is None and len(token_candidates) == 1:
        token_input = token_candidates[0]
    if token_input is None:
        found = ", ".join(token_candidates) or "none"
        raise TrtfuseError(
            f"{source}: cannot tell which input holds the token ids (integer inputs: {found}); generation feeds an "
            "input named input_ids"
        )
    known = {token_input, *masks[:1], *positions[:1]}
    unknown = [value.name for value in others if value.name not in known]
    if unknown:
        raise TrtfuseError(
            f"{source}: input {unknown[0]!r} is none of token ids, attention mask, position ids, KV cache or a "
            "length; generation does not know what to feed it"
        )
    caches = _cache_pairs(model, reading, source)
    return GenerationInterface(
        source=source,
        reading=reading,
        token_input=token_input,
        mask_input=masks[0] if masks else None,
        position_input=positions[0] if positions else None,
        caches=caches,
        logits=_logits_output(model),
        vocabulary=_vocabulary(model, token_input),
        dtypes=dtypes,
        output_names=tuple(output.name for output in model.graph.output),
        cast_notes=tuple(_cast_notes(model, caches, dtypes)),
    )


def _numpy_dtype(value: onnx.ValueInfoProto, source: str) -> np.dtype:
    try:
        return np.dtype(helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type))
    except (KeyError, ValueError, TypeError):
        raise TrtfuseError(f"{source}: input {value.name!r} has no numeric dtype; cannot feed it") from None


def _is_integer(dtype: np.dtype) -> bool:
    return np.issubdtype(dtype, np.integer) or dtype == np.bool_


def _cache_key(name: str) -> str:
    return _CACHE_PREFIX.sub("", name)


def _cache_pairs(model: onnx.ModelProto, reading: ModelDims, source: str) -> tuple[CachePair, ...]:
    """Each cache input with the output that returns it: same name once `past_key_values`/`present` is taken off."""
    presents = {
        _cache_key(output.name): output.name
        for output in model.graph.output
        if _CACHE_PREFIX.match(output.name) and output.name.lower().startswith("present")
    }
    pairs = []
    for name in reading.cache_inputs:
        present = presents.get(_cache_key(name))
        if present is None:
            raise TrtfuseError(
                f"{source}: cache input {name!r} has no output that returns it (looked for "
                f"present{'.' if _cache_key(name) else ''}{_cache_key(name)}); generation cannot carry the cache"
            )
        pairs.append(CachePair(name, present))
    return tuple(pairs)


def _cast_notes(model: onnx.ModelProto, caches: Sequence[CachePair], dtypes: Mapping[str, np.dtype]) -> list[str]:
    declared = {output.name: output.type.tensor_type.elem_type for output in model.graph.output}
    notes = []
    for pair in caches:
        elem = declared.get(pair.present)
        if not elem:
            continue
        present = np.dtype(helper.tensor_dtype_to_np_dtype(elem))
        if present != dtypes[pair.past]:
            notes.append(
                f"output {pair.present!r} is {present.name} but input {pair.past!r} takes {dtypes[pair.past].name}: "
                "cast before it is fed back"
            )
    return notes


def _logits_output(model: onnx.ModelProto) -> str | None:
    """The output named logits, else the one output whose name holds it (`lm_logits`); a model's other float
    outputs (hidden states, presents) are not guessed at."""
    names = [output.name for output in model.graph.output]
    if LOGITS in names:
        return LOGITS
    candidates = [name for name in names if LOGITS in name.lower()]
    return candidates[0] if len(candidates) == 1 else None


def _vocabulary(model: onnx.ModelProto, token_input: str) -> Bound | None:
    """How many token ids the model takes: the rows of the embedding table the token ids index, else the logits'
    static last dim."""
    tables = {tensor.name: tuple(tensor.dims) for tensor in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Gather" and len(node.input) == 2 and node.input[1] == token_input:
            table = tables.get(node.input[0])
            axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
            if table and axis == 0:
                return Bound(table[0], f"the embedding table {node.input[0]!r} has {table[0]} rows")
    for output in model.graph.output:
        if output.name == _logits_output(model):
            dims = output.type.tensor_type.shape.dim
            if dims and dims[-1].HasField("dim_value"):
                return Bound(dims[-1].dim_value, f"output {output.name!r} has {dims[-1].dim_value} logits")
    return None
