"""Export tiny, randomly initialised Hugging Face LLMs to ONNX and record how many norms each forward pass runs.

Every model is built from a config written here (no hub access), with 2 layers, hidden size 64 and a 128-token
vocabulary, so one export is a few hundred kB. The norm weights get random non-trivial values so a fusion that
drops or misplaces the weight changes the numerics. Each model is exported with the TorchScript exporter at opset 17
and the dynamo exporter at opset 18, in fp32 and fp16, with dynamic batch and sequence dims on `input_ids` and the
logits as the only output. `expected.json` records, per file, how many RMSNorm module calls one forward pass makes:
the number of norms the fusion pass must find; and how many of them read a residual sum, which it fuses with their
Add.

With --cache the exports take and return the KV cache, named as optimum names it: inputs input_ids,
attention_mask, position_ids, past_key_values.N.key/value, outputs logits, present.N.key/value, each cache tensor
[batch_size, kv_heads, past_sequence_length (+ sequence_length), head_dim]; batch, sequence and past length dynamic.
Each is checked in onnxruntime against torch at a prefill and a decode step and by 8 greedy tokens. --checkpoint
exports a local Hugging Face checkpoint folder (config.json and weights, no hub access) instead of a tiny model.

\b
    python models/export.py --out models/fixtures          # the committed fixture set
    python models/export.py --out /tmp/all --all           # every architecture × exporter × dtype
    python models/export.py --out /tmp/q --arch qwen3 --exporter dynamo --dtype float16
    python models/export.py --cache --out models/fixtures/kv   # the committed KV-cache fixture
    python models/export.py --cache --out /tmp/kv --exporter torchscript --exporter dynamo   # 5 families × 4 forms
    python models/export.py --cache --out /tmp/m --checkpoint ./my-model --exporter dynamo --dtype float16
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import inspect
import json
import sys
import tempfile
import traceback
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import click
import numpy as np
import onnx
import onnxruntime
from extras import FORCE_HELP, check_exports, exit_missing

from trtfuse.model.dims import POSITIONS_METADATA_KEY

try:
    import torch
    import transformers
    from torch import nn
    from transformers import (
        AutoModelForCausalLM,
        CohereConfig,
        DeepseekV3Config,
        DynamicCache,
        Gemma3TextConfig,
        GPT2Config,
        LlamaConfig,
        MistralConfig,
        Olmo2Config,
        Phi3Config,
        PretrainedConfig,
        Qwen3Config,
    )
except ModuleNotFoundError as missing:
    exit_missing(missing)

VOCAB = 128
HIDDEN = 64
LAYERS = 2
HEADS = 2
KV_HEADS = 1
# Per-head norms are built for head dims of 64/128/256; 64 keeps the QK-norm fixtures inside that range.
HEAD_DIM = 64
INTERMEDIATE = 64
SAMPLE_BATCH = 2
# Not 1 and not equal to the batch, so neither exporter specialises a dynamic dim to the sample's value.
SAMPLE_SEQUENCE = 7
# The export is run in onnxruntime at this other shape and compared with torch, so a dim the exporter baked in fails.
CHECK_SHAPE = (3, 5)
# fp16 matmuls accumulate differently in torch's CPU kernels and onnxruntime's; fp32 agrees to rounding.
EXPORT_TOLERANCE = {"float32": 1e-4, "float16": 1e-2}

EXPORTERS = {"torchscript": 17, "dynamo": 18}
DTYPES = {"float32": torch.float32, "float16": torch.float16}
DTYPE_TAGS = {"float32": "fp32", "float16": "fp16"}
# Module attribute names of the norms applied to the query and key projections: per-head q/k norms (Qwen3,
# Gemma3), full-width ones (OLMo2), and DeepSeek's MLA norms on the compressed q and kv latents.
QK_NORM_NAMES = frozenset({"q_norm", "k_norm"})
MLA_NORM_NAMES = frozenset({"q_a_layernorm", "kv_a_layernorm"})
STACK_TRACE_KEY = "pkg.torch.onnx.stack_trace"


@dataclass(frozen=True)
class Architecture:
    """One model family: its tiny config and how its norm weights are parameterised."""

    name: str
    build_config: Callable[[], PretrainedConfig]
    # Weight values scatter around this: 1 for y = x·r·w, 0 for Gemma's zero-centred y = x·r·(1 + w).
    norm_weight_centre: float
    uses_rms_norm: bool
    epsilon: float
    # Mixture-of-experts layers: "batched_mm" gathers each token's expert weights and runs one batched matmul, which
    # both exporters translate; the default grouped_mm path calls torch.histc, which neither of them can.
    experts_implementation: str | None = None


def _llama() -> PretrainedConfig:
    return LlamaConfig(**_common(), head_dim=HEAD_DIM, rms_norm_eps=1e-5)


def _qwen3() -> PretrainedConfig:
    return Qwen3Config(**_common(), head_dim=HEAD_DIM, rms_norm_eps=1e-6)


def _gemma3() -> PretrainedConfig:
    return Gemma3TextConfig(
        **_common(),
        head_dim=HEAD_DIM,
        rms_norm_eps=1e-6,
        query_pre_attn_scalar=HEAD_DIM,
        layer_types=["sliding_attention", "full_attention"],
        sliding_window=4,
    )


def _mistral() -> PretrainedConfig:
    return MistralConfig(**_common(), head_dim=HEAD_DIM, rms_norm_eps=1e-5, sliding_window=None)


def _olmo2() -> PretrainedConfig:
    return Olmo2Config(**_common(), rms_norm_eps=1e-6)


def _phi3() -> PretrainedConfig:
    return Phi3Config(**_common(), rms_norm_eps=1e-5, pad_token_id=0, bos_token_id=1, eos_token_id=2)


def _deepseek_v3() -> PretrainedConfig:
    # MLA expands one latent into every head's keys and values; the eager path has no grouped-query form.
    return DeepseekV3Config(
        **{**_common(), "num_key_value_heads": HEADS},
        rms_norm_eps=1e-6,
        moe_intermediate_size=32,
        n_routed_experts=4,
        n_shared_experts=1,
        num_experts_per_tok=2,
        n_group=1,
        topk_group=1,
        first_k_dense_replace=1,
        q_lora_rank=48,
        kv_lora_rank=32,
        qk_rope_head_dim=16,
        qk_nope_head_dim=32,
        v_head_dim=32,
    )


def _gpt2() -> PretrainedConfig:
    return GPT2Config(
        vocab_size=VOCAB,
        n_embd=HIDDEN,
        n_inner=INTERMEDIATE,
        n_layer=LAYERS,
        n_head=HEADS,
        n_positions=128,
        bos_token_id=1,
        eos_token_id=2,
    )


def _cohere() -> PretrainedConfig:
    return CohereConfig(**_common(), use_qk_norm=False, pad_token_id=0, bos_token_id=1, eos_token_id=2)


def _common() -> dict[str, object]:
    return {
        "vocab_size": VOCAB,
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "max_position_embeddings": 128,
        "tie_word_embeddings": False,
    }


ARCHITECTURES = {
    arch.name: arch
    for arch in (
        Architecture("llama", _llama, 1.0, True, 1e-5),
        Architecture("qwen3", _qwen3, 1.0, True, 1e-6),
        Architecture("gemma3", _gemma3, 0.0, True, 1e-6),
        Architecture("olmo2", _olmo2, 1.0, True, 1e-6),
        Architecture("phi3", _phi3, 1.0, True, 1e-5),
        Architecture("deepseek_v3", _deepseek_v3, 1.0, True, 1e-6, experts_implementation="batched_mm"),
        Architecture("gpt2", _gpt2, 1.0, False, 1e-5),
        Architecture("cohere", _cohere, 1.0, False, 1e-5),
    )
}
# --cache exports also build Mistral (the logits-only set predates it; tool_exports.py builds it for the tools).
KV_ARCHITECTURES = {**ARCHITECTURES, "mistral": Architecture("mistral", _mistral, 1.0, True, 1e-5)}
# What `--cache` exports when no --arch is given: the families the KV-cache exports were asked for.
KV_FAMILIES = ("llama", "qwen3", "gemma3", "mistral", "phi3")


@dataclass(frozen=True)
class ExportSpec:
    arch: str
    exporter: str
    dtype: str
    # A KV-cache export (`--cache`): cache inputs and present outputs, not logits alone.
    cache: bool = False
    # A local Hugging Face checkpoint folder to load instead of building `arch`'s tiny config (`arch` is its
    # config's model_type then).
    checkpoint: Path | None = None

    @property
    def opset(self) -> int:
        return EXPORTERS[self.exporter]

    @property
    def filename(self) -> str:
        stem = self.checkpoint.name if self.checkpoint is not None else self.arch
        return f"{stem}-{self.exporter}-{DTYPE_TAGS[self.dtype]}{'-kv' if self.cache else ''}.onnx"


# The committed set, about 7.8 MB: every architecture, both exporters and both dtypes; Llama in all four forms; the
# q/k-norm families in the TorchScript fp16 form and both dynamo forms. Cohere's TorchScript export only runs at the
# traced shape (models/README.md), so the decomposed-LayerNorm negative is a dynamo export.
FIXTURES = (
    *(ExportSpec("llama", exporter, dtype) for exporter in EXPORTERS for dtype in DTYPES),
    *(
        ExportSpec(arch, exporter, dtype)
        for arch in ("qwen3", "gemma3")
        for exporter, dtype in (("torchscript", "float16"), ("dynamo", "float32"), ("dynamo", "float16"))
    ),
    ExportSpec("olmo2", "torchscript", "float16"),
    ExportSpec("olmo2", "dynamo", "float32"),
    ExportSpec("phi3", "torchscript", "float16"),
    ExportSpec("phi3", "dynamo", "float16"),
    ExportSpec("deepseek_v3", "torchscript", "float16"),
    ExportSpec("deepseek_v3", "dynamo", "float32"),
    ExportSpec("gpt2", "torchscript", "float16"),
    ExportSpec("cohere", "dynamo", "float32"),
    ExportSpec("cohere", "dynamo", "float16"),
)


class LogitsOnly(nn.Module):
    """Returns the logits tensor alone, so both exporters see one plain tensor output and no cache objects.

    The all-ones attention mask keeps transformers off its packed-sequence check, whose `aten::diff` the TorchScript
    exporter cannot translate; the models see the same causal attention as without a mask.
    """

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), use_cache=False).logits


def build_model(arch: Architecture, dtype: str, seed: int = 0) -> LogitsOnly:
    torch.manual_seed(seed)
    implementations = {"experts_implementation": arch.experts_implementation} if arch.experts_implementation else {}
    model = AutoModelForCausalLM.from_config(arch.build_config(), attn_implementation="eager", **implementations)
    _randomise_norm_weights(model, arch.norm_weight_centre)
    # The wrapper itself must be in eval mode: after exporting, the TorchScript exporter puts every submodule back into
    # the top module's training mode, which would switch GPT-2's dropout on for the torch comparison that follows.
    return LogitsOnly(model.to(DTYPES[dtype])).eval()


def _randomise_norm_weights(model: nn.Module, centre: float) -> None:
    with torch.no_grad():
        for module in model.modules():
            if not type(module).__name__.endswith(("RMSNorm", "LayerNorm")):
                continue
            weight = getattr(module, "weight", None)
            if isinstance(weight, torch.Tensor):
                weight.copy_(centre + 0.1 * torch.randn_like(weight))
            bias = getattr(module, "bias", None)
            if isinstance(bias, torch.Tensor):
                bias.copy_(0.1 * torch.randn_like(bias))


@dataclass(frozen=True)
class NormCalls:
    total: int
    qk: int
    mla: int
    # Calls whose input is a residual sum: what the fusion pass fuses with its Add into one TrtfuseAddRmsNorm.
    residual: int


class _ResidualSums(torch.overrides.TorchFunctionMode):
    """Records each tensor that is the sum of two tensors of one shape (`residual + hidden_states`), kept alive so
    that no other tensor takes its identity."""

    ADDS = (torch.add, torch.Tensor.add, torch.Tensor.add_, torch.Tensor.__add__, torch.Tensor.__iadd__,
            torch.Tensor.__radd__)  # fmt: skip

    def __init__(self) -> None:
        super().__init__()
        self.sums: list[torch.Tensor] = []

    def __torch_function__(
        self, func: Callable[..., object], types: object, args: tuple = (), kwargs: dict | None = None
    ) -> object:
        result = func(*args, **(kwargs or {}))
        operands = args[:2]
        if (
            func in self.ADDS
            and len(operands) == 2
            and all(isinstance(operand, torch.Tensor) for operand in operands)
            and operands[0].shape == operands[1].shape
        ):
            self.sums.append(result)
        return result

    def holds(self, tensor: object) -> bool:
        return any(tensor is total for total in self.sums)


def count_norm_calls(model: nn.Module, input_ids: torch.Tensor) -> NormCalls:
    """Counts the RMSNorm module calls of one forward pass, and among them the q/k and MLA latent norms and those that
    read a residual sum."""
    calls = {"total": 0, "qk": 0, "mla": 0, "residual": 0}
    sums = _ResidualSums()
    handles = []
    for name, module in model.named_modules():
        if not type(module).__name__.endswith("RMSNorm"):
            continue
        leaf = name.rsplit(".", 1)[-1]
        kinds = ["total"]
        if leaf in QK_NORM_NAMES:
            kinds.append("qk")
        if leaf in MLA_NORM_NAMES:
            kinds.append("mla")

        def hook(_module: nn.Module, args: tuple, _output: object, kinds: list[str] = kinds) -> None:
            for kind in kinds:
                calls[kind] += 1
            if "qk" not in kinds and args and sums.holds(args[0]):
                calls["residual"] += 1

        handles.append(module.register_forward_hook(hook))
    try:
        with torch.no_grad(), sums:
            model(input_ids)
    finally:
        for handle in handles:
            handle.remove()
    return NormCalls(**calls)


def random_input_ids(batch: int, sequence: int, seed: int, vocab: int = VOCAB) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (batch, sequence), generator=generator)


def export_onnx(model: nn.Module, input_ids: torch.Tensor, spec: ExportSpec, path: Path) -> None:
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        if spec.exporter == "torchscript":
            torch.onnx.export(
                model,
                (input_ids,),
                str(path),
                dynamo=False,
                opset_version=spec.opset,
                input_names=["input_ids"],
                output_names=["logits"],
                dynamic_axes={"input_ids": {0: "batch", 1: "sequence"}, "logits": {0: "batch", 1: "sequence"}},
            )
        else:
            batch = torch.export.Dim("batch", min=1, max=64)
            sequence = torch.export.Dim("sequence", min=1, max=128)
            program = torch.onnx.export(
                model,
                (input_ids,),
                dynamo=True,
                opset_version=spec.opset,
                input_names=["input_ids"],
                output_names=["logits"],
                dynamic_shapes={"input_ids": {0: batch, 1: sequence}},
            )
            program.save(str(path), external_data=False)


def _drop_stack_traces(path: Path) -> None:
    """Removes the dynamo exporter's per-node Python stack traces: half the file, and full of this machine's paths."""
    model = onnx.load(str(path))
    for node in model.graph.node:
        kept = [prop for prop in node.metadata_props if prop.key != STACK_TRACE_KEY]
        del node.metadata_props[:]
        node.metadata_props.extend(kept)
    onnx.save(model, str(path))


class ExportMismatchError(RuntimeError):
    """The exported graph computes something else than the torch model, e.g. a dim baked in by tracing."""


def onnxruntime_error(model: nn.Module, path: Path) -> float:
    """Max abs difference of the logits over max |torch logits|, at a shape other than the sample's."""
    input_ids = random_input_ids(*CHECK_SHAPE, seed=1)
    with torch.no_grad():
        expected = model(input_ids).float().numpy()
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (logits,) = session.run(None, {"input_ids": input_ids.numpy()})
    return float(np.abs(logits.astype(np.float32) - expected).max() / np.abs(expected).max())


def export_one(spec: ExportSpec, out_dir: Path) -> dict[str, object]:
    arch = ARCHITECTURES[spec.arch]
    model = build_model(arch, spec.dtype)
    input_ids = random_input_ids(SAMPLE_BATCH, SAMPLE_SEQUENCE, seed=0)
    calls = count_norm_calls(model, input_ids)
    path = out_dir / spec.filename
    export_onnx(model, input_ids, spec, path)
    _drop_stack_traces(path)
    onnx.checker.check_model(str(path), full_check=True)
    error = onnxruntime_error(model, path)
    if error > EXPORT_TOLERANCE[spec.dtype]:
        raise ExportMismatchError(
            f"onnxruntime logits differ from torch's by {error:.2e} (max rel) at batch, sequence = {CHECK_SHAPE}"
        )
    return {
        "architecture": spec.arch,
        "exporter": spec.exporter,
        "opset": spec.opset,
        "dtype": spec.dtype,
        "epsilon": arch.epsilon if arch.uses_rms_norm else None,
        "norm_calls": calls.total,
        "qk_norm_calls": calls.qk,
        "mla_norm_calls": calls.mla,
        "add_norm_calls": calls.residual,
        "uses_rms_norm": arch.uses_rms_norm,
        "bytes": path.stat().st_size,
        "max_rel_error_vs_torch": error,
    }


# --- KV-cache exports (--cache) ------------------------------------------------------------------------------------

# Traced at batch 2, 3 new tokens after 4 cached ones: no two equal, none 0 or 1, none a head count or head width.
KV_SAMPLE = (2, 3, 4)
# Checked at batch 3: a prefill of 5 tokens (past 0), then a decode step of 1 token after the prefill's presents.
KV_CHECK_PREFILL = (3, 5)
# Greedy generation from the same prompt in torch (transformers' generate) and onnxruntime (the presents fed back).
GENERATE_PROMPT = (2, 6)
GENERATE_TOKENS = 8
# Params above this go to one external data file beside the .onnx (protobuf's limit is 2 GiB).
EXTERNAL_DATA_BYTES = 1_500_000_000
# optimum's dim names, which trtfuse.model.dims reads as batch, tokens, past and past + tokens.
BATCH_DIM, SEQUENCE_DIM, PAST_DIM = "batch_size", "sequence_length", "past_sequence_length"
TOTAL_DIM = f"{PAST_DIM} + {SEQUENCE_DIM}"
# A torch.export Dim name must be an identifier: the dynamo export's mask length is renamed to TOTAL_DIM afterwards.
DYNAMO_TOTAL_DIM = "total_sequence_length"
# The committed KV-cache fixture (fixtures/kv/): what `--cache` exports without --arch, --exporter, --dtype or --all.
KV_FIXTURES = (ExportSpec("qwen3", "dynamo", "float32", cache=True),)


@dataclass(frozen=True)
class CacheLayout:
    """The KV cache a model fills, per layer: (key heads, key width, value heads, value width); and the layers that
    transformers' own cache keeps as a sliding window (the export keeps their whole past, see WithCache)."""

    layers: tuple[tuple[int, int, int, int], ...]
    sliding: tuple[int, ...] = ()

    @property
    def cache_names(self) -> list[str]:
        return [f"{i}.{kind}" for i in range(len(self.layers)) for kind in ("key", "value")]

    @property
    def input_names(self) -> list[str]:
        return ["input_ids", "attention_mask", "position_ids", *(f"past_key_values.{n}" for n in self.cache_names)]

    @property
    def output_names(self) -> list[str]:
        return ["logits", *(f"present.{n}" for n in self.cache_names)]

    def past(self, batch: int, length: int, dtype: torch.dtype, seed: int) -> list[torch.Tensor]:
        generator = torch.Generator().manual_seed(seed)
        return [
            torch.randn(batch, heads, length, width, generator=generator).to(dtype)
            for key_heads, key_width, value_heads, value_width in self.layers
            for heads, width in ((key_heads, key_width), (value_heads, value_width))
        ]

    def to_json(self) -> dict[str, object]:
        layout = {
            "layers": len(self.layers),
            "dims": [BATCH_DIM, "kv_heads", PAST_DIM, "head_dim"],
            "full_length_sliding_layers": list(self.sliding),
        }
        key_heads, key_width, value_heads, value_width = self.layers[0]
        if len(set(self.layers)) == 1 and key_heads == value_heads:
            return {**layout, "kv_heads": key_heads, "key_head_dim": key_width, "value_head_dim": value_width}
        return {**layout, "per_layer": [list(layer) for layer in self.layers]}


def _cache_argument(model: nn.Module) -> str:
    # transformers 5 renamed forward's `past_key_values` to `cache` (the old name is deprecated).
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def _filled_cache(output: object) -> object:
    cache = getattr(output, "cache", None)
    return cache if cache is not None else output.past_key_values


class WithCache(nn.Module):
    """A causal LM with its KV cache as flat tensors, in optimum's order:
    (input_ids, attention_mask, position_ids, past key 0, past value 0, past key 1, ...) ->
    (logits, present key 0, present value 0, ...), each cache tensor [batch, kv_heads, length, head_dim].

    The past tensors fill a config-less DynamicCache, one full-length DynamicLayer per layer, and the model runs with
    use_cache=True as in generation; the presents are that cache's tensors after the step (past + new tokens). A
    sliding-window layer (Gemma3) therefore keeps the whole past too, its window applied by the attention mask.
    """

    def __init__(self, model: nn.Module, layers: int) -> None:
        super().__init__()
        self.model = model
        self.layers = layers
        self.cache_argument = _cache_argument(model)

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor, *past: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        cache = DynamicCache()
        for layer in range(self.layers):
            cache.update(past[2 * layer], past[2 * layer + 1], layer)
        output = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=True,
            **{self.cache_argument: cache},
        )
        presents = [tensor for layer in _filled_cache(output).layers for tensor in (layer.keys, layer.values)]
        return (output.logits, *presents)


def _step_inputs(input_ids: torch.Tensor, past_length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The all-ones attention mask over past + new tokens, and position ids counting on from the past."""
    batch, tokens = input_ids.shape
    mask = torch.ones(batch, past_length + tokens, dtype=torch.int64)
    positions = torch.arange(past_length, past_length + tokens, dtype=torch.int64).expand(batch, tokens).contiguous()
    return mask, positions


def native_step(model: nn.Module, input_ids: torch.Tensor, cache: object | None) -> tuple[torch.Tensor, object]:
    """The model as transformers itself runs a generation step: its own cache object (None: a new one, which for
    Gemma3 keeps only the sliding window on sliding layers). Returns the logits and the filled cache."""
    past_length = cache.get_seq_length() if cache is not None else 0
    mask, positions = _step_inputs(input_ids, past_length)
    with torch.no_grad():
        output = model(
            input_ids=input_ids,
            attention_mask=mask,
            position_ids=positions,
            use_cache=True,
            **{_cache_argument(model): cache},
        )
    return output.logits, _filled_cache(output)


def cache_layout(model: nn.Module) -> CacheLayout:
    """Heads and widths of every layer's keys and values, and which layers slide, read off the cache a two-token
    prefill fills."""
    _, cache = native_step(model, torch.zeros(1, 2, dtype=torch.int64), None)
    return CacheLayout(
        tuple((*layer.keys.shape[1:2], layer.keys.shape[3], *layer.values.shape[1:2], layer.values.shape[3])
              for layer in cache.layers),
        tuple(index for index, layer in enumerate(cache.layers) if getattr(layer, "is_sliding", False)),
    )  # fmt: skip


def _parameter_bytes(model: nn.Module) -> int:
    return sum(parameter.numel() * parameter.element_size() for parameter in model.parameters())


def export_cache_onnx(
    wrapper: WithCache, layout: CacheLayout, spec: ExportSpec, path: Path, dtype: torch.dtype
) -> None:
    """Exports `wrapper` with optimum's names and dims; batch, sequence and past length dynamic."""
    batch, tokens, past_length = KV_SAMPLE
    input_ids = random_input_ids(batch, tokens, seed=0, vocab=wrapper.model.config.vocab_size)
    args = (input_ids, *_step_inputs(input_ids, past_length), *layout.past(batch, past_length, dtype, seed=0))
    inputs, outputs = layout.input_names, layout.output_names
    large = _parameter_bytes(wrapper) > EXTERNAL_DATA_BYTES
    with tempfile.TemporaryDirectory(dir=path.parent) as scratch, warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        exported = Path(scratch) / "model.onnx"
        if spec.exporter == "torchscript":
            dynamic_axes = {
                "input_ids": {0: BATCH_DIM, 1: SEQUENCE_DIM},
                "attention_mask": {0: BATCH_DIM, 1: TOTAL_DIM},
                "position_ids": {0: BATCH_DIM, 1: SEQUENCE_DIM},
                "logits": {0: BATCH_DIM, 1: SEQUENCE_DIM},
                **{name: {0: BATCH_DIM, 2: PAST_DIM} for name in inputs[3:]},
                **{name: {0: BATCH_DIM, 2: TOTAL_DIM} for name in outputs[1:]},
            }
            torch.onnx.export(
                wrapper,
                args,
                str(exported),
                dynamo=False,
                opset_version=spec.opset,
                input_names=inputs,
                output_names=outputs,
                dynamic_axes=dynamic_axes,
            )
        else:
            batch_dim = torch.export.Dim(BATCH_DIM, min=1)
            sequence_dim = torch.export.Dim(SEQUENCE_DIM, min=1)
            past_dim = torch.export.Dim(PAST_DIM, min=0)
            total_dim = torch.export.Dim(DYNAMO_TOTAL_DIM, min=1)
            program = torch.onnx.export(
                wrapper,
                args,
                dynamo=True,
                opset_version=spec.opset,
                input_names=inputs,
                output_names=outputs,
                dynamic_shapes={
                    "input_ids": {0: batch_dim, 1: sequence_dim},
                    "attention_mask": {0: batch_dim, 1: total_dim},
                    "position_ids": {0: batch_dim, 1: sequence_dim},
                    "past": tuple({0: batch_dim, 2: past_dim} for _ in inputs[3:]),
                },
            )
            program.save(str(exported), external_data=large)
        graph = onnx.load(str(exported))
    _tidy(graph, {DYNAMO_TOTAL_DIM: TOTAL_DIM})
    _record_positions(graph, wrapper.model.config)
    if large:
        location = path.name + ".data"
        (path.parent / location).unlink(missing_ok=True)
        onnx.save_model(graph, str(path), save_as_external_data=True, all_tensors_to_one_file=True, location=location)
        # onnx writes the data file owner-only; give it the .onnx file's permissions.
        (path.parent / location).chmod(path.stat().st_mode & 0o777)
    else:
        onnx.save_model(graph, str(path))


def _record_positions(graph: onnx.ModelProto, config: PretrainedConfig) -> None:
    """The positions the model was trained for, in the model's metadata, where trtfuse reads them: a profile or a
    generation that goes past them is warned about (the graph computes its rotary angles for any position)."""
    positions = getattr(config.get_text_config(), "max_position_embeddings", None)
    if isinstance(positions, int) and positions > 0:
        graph.metadata_props.add(key=POSITIONS_METADATA_KEY, value=str(positions))


def _tidy(graph: onnx.ModelProto, renames: dict[str, str]) -> None:
    """Drops the dynamo exporter's stack traces and renames symbolic dims everywhere they appear."""
    for node in graph.graph.node:
        kept = [prop for prop in node.metadata_props if prop.key != STACK_TRACE_KEY]
        del node.metadata_props[:]
        node.metadata_props.extend(kept)
    for value in (*graph.graph.input, *graph.graph.output, *graph.graph.value_info):
        for dim in value.type.tensor_type.shape.dim:
            if dim.HasField("dim_param") and dim.dim_param in renames:
                dim.dim_param = renames[dim.dim_param]


def _relative_error(actual: np.ndarray, expected: torch.Tensor) -> float:
    """Max abs difference over max |expected|."""
    reference = expected.float().numpy()
    if actual.shape != reference.shape:
        raise ExportMismatchError(f"onnxruntime gives shape {actual.shape}, torch {reference.shape}")
    return float(np.abs(actual.astype(np.float32) - reference).max() / max(np.abs(reference).max(), 1e-30))


def _feed(layout: CacheLayout, input_ids: torch.Tensor, past: Sequence[np.ndarray]) -> dict[str, np.ndarray]:
    mask, positions = _step_inputs(input_ids, past[0].shape[2])
    values = (input_ids.numpy(), mask.numpy(), positions.numpy(), *past)
    return dict(zip(layout.input_names, values, strict=True))


def check_cache_steps(
    wrapper: WithCache, layout: CacheLayout, session: onnxruntime.InferenceSession, dtype: torch.dtype
) -> dict[str, float]:
    """onnxruntime against torch at a prefill (past 0) and a decode step (1 token, the prefill's presents as past),
    at a batch and lengths other than the traced ones. At each step every output is compared with the wrapper run in
    torch on the same inputs, and the logits also with the model run as transformers runs it (its own cache), so
    that the flat-cache wrapper itself is checked too. Returns the max rel error of each step."""
    batch, tokens = KV_CHECK_PREFILL
    vocab = wrapper.model.config.vocab_size
    errors = {}
    native_cache = None
    past = [tensor.numpy() for tensor in layout.past(batch, 0, dtype, seed=0)]
    for step, input_ids in (
        ("prefill", random_input_ids(batch, tokens, seed=1, vocab=vocab)),
        ("decode", random_input_ids(batch, 1, seed=2, vocab=vocab)),
    ):
        feed = _feed(layout, input_ids, past)
        onnx_outputs = session.run(None, feed)
        with torch.no_grad():
            torch_outputs = wrapper(
                *(torch.from_numpy(np.ascontiguousarray(feed[name])) for name in layout.input_names)
            )
        native_logits, native_cache = native_step(wrapper.model, input_ids, native_cache)
        errors[step] = max(
            *(_relative_error(actual, expected) for actual, expected in zip(onnx_outputs, torch_outputs, strict=True)),
            _relative_error(onnx_outputs[0], native_logits),
        )
        past = onnx_outputs[1:]
    return errors


def greedy_tokens(
    wrapper: WithCache, layout: CacheLayout, session: onnxruntime.InferenceSession, dtype: torch.dtype
) -> tuple[list[list[int]], list[list[int]]]:
    """GENERATE_TOKENS greedy tokens from one prompt: transformers' generate, and onnxruntime fed its own presents."""
    prompt = random_input_ids(*GENERATE_PROMPT, seed=3, vocab=wrapper.model.config.vocab_size)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        generated = wrapper.model.generate(
            input_ids=prompt,
            attention_mask=torch.ones_like(prompt),
            max_new_tokens=GENERATE_TOKENS,
            min_new_tokens=GENERATE_TOKENS,
            do_sample=False,
            pad_token_id=0,
        )
    torch_tokens = generated[:, prompt.shape[1] :].tolist()
    input_ids = prompt
    past = [tensor.numpy() for tensor in layout.past(prompt.shape[0], 0, dtype, seed=0)]
    onnx_tokens = []
    for _ in range(GENERATE_TOKENS):
        logits, *past = session.run(None, _feed(layout, input_ids, past))
        next_tokens = logits[:, -1].astype(np.float32).argmax(-1)
        onnx_tokens.append(next_tokens)
        input_ids = torch.from_numpy(next_tokens[:, None].astype(np.int64))
    return torch_tokens, np.stack(onnx_tokens, axis=1).tolist()


def build_cache_model(spec: ExportSpec) -> nn.Module:
    """The Hugging Face model of `spec`: a local checkpoint, or the tiny random model of its architecture."""
    if spec.checkpoint is None:
        return build_model(KV_ARCHITECTURES[spec.arch], spec.dtype).model
    # HF_HUB_OFFLINE is set above; local_files_only keeps from_pretrained off the hub whatever the environment says.
    model = AutoModelForCausalLM.from_pretrained(
        spec.checkpoint, local_files_only=True, dtype=DTYPES[spec.dtype], attn_implementation="eager"
    )
    return model.eval()


def export_cache_one(spec: ExportSpec, out_dir: Path) -> dict[str, object]:
    model = build_cache_model(spec)
    dtype = DTYPES[spec.dtype]
    vocab = model.config.vocab_size
    calls = count_norm_calls(model, random_input_ids(SAMPLE_BATCH, SAMPLE_SEQUENCE, seed=0, vocab=vocab))
    layout = cache_layout(model)
    wrapper = WithCache(model, len(layout.layers)).eval()
    path = out_dir / spec.filename
    export_cache_onnx(wrapper, layout, spec, path, dtype)
    onnx.checker.check_model(str(path), full_check=True)
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    errors = check_cache_steps(wrapper, layout, session, dtype)
    for step, error in errors.items():
        if error > EXPORT_TOLERANCE[spec.dtype]:
            raise ExportMismatchError(f"{step} step: onnxruntime differs from torch by {error:.2e} (max rel)")
    torch_tokens, onnx_tokens = greedy_tokens(wrapper, layout, session, dtype)
    # fp16 logits of a random model have near-ties that rounding may flip; the tokens must agree in fp32.
    if spec.dtype == "float32" and torch_tokens != onnx_tokens:
        raise ExportMismatchError(f"greedy tokens differ: torch {torch_tokens}, onnxruntime {onnx_tokens}")
    if spec.checkpoint is None:
        arch = KV_ARCHITECTURES[spec.arch]
        epsilon = arch.epsilon if arch.uses_rms_norm else None
        uses_rms_norm = arch.uses_rms_norm
    else:
        text_config = model.config.get_text_config()
        epsilon = getattr(text_config, "rms_norm_eps", None) if calls.total else None
        uses_rms_norm = calls.total > 0
    graph = onnx.load(str(path), load_external_data=False)
    return {
        "architecture": spec.arch,
        "exporter": spec.exporter,
        "opset": spec.opset,
        "dtype": spec.dtype,
        "epsilon": epsilon,
        "norm_calls": calls.total,
        "qk_norm_calls": calls.qk,
        "mla_norm_calls": calls.mla,
        "add_norm_calls": calls.residual,
        "uses_rms_norm": uses_rms_norm,
        "bytes": sum(file.stat().st_size for file in (path, path.with_name(f"{path.name}.data")) if file.exists()),
        "cache": layout.to_json(),
        "inputs": [value.name for value in graph.graph.input],
        "outputs": [value.name for value in graph.graph.output],
        "dims": {value.name: _dims(value) for value in (*graph.graph.input, *graph.graph.output)},
        "max_rel_error_vs_torch": errors,
        "greedy_tokens": {"torch": torch_tokens, "onnxruntime": onnx_tokens, "match": torch_tokens == onnx_tokens},
    }


def _dims(value: onnx.ValueInfoProto) -> list[int | str]:
    return [dim.dim_param or dim.dim_value for dim in value.type.tensor_type.shape.dim]


def select_specs(
    all_combinations: bool, archs: tuple[str, ...], exporters: tuple[str, ...], dtypes: tuple[str, ...]
) -> list[ExportSpec]:
    if not (all_combinations or archs or exporters or dtypes):
        return list(FIXTURES)
    return [
        ExportSpec(arch, exporter, dtype)
        for arch in archs or ARCHITECTURES
        for exporter in exporters or EXPORTERS
        for dtype in dtypes or DTYPES
    ]


def select_cache_specs(
    all_combinations: bool,
    archs: tuple[str, ...],
    exporters: tuple[str, ...],
    dtypes: tuple[str, ...],
    checkpoint: Path | None,
) -> list[ExportSpec]:
    """--cache: a checkpoint in every exporter × dtype asked for (all by default); else the KV fixture, the KV
    families (--exporter/--dtype without --arch) or every architecture (--all)."""
    if checkpoint is not None:
        return [
            ExportSpec(checkpoint_model_type(checkpoint), exporter, dtype, cache=True, checkpoint=checkpoint)
            for exporter in exporters or EXPORTERS
            for dtype in dtypes or DTYPES
        ]
    if not (all_combinations or archs or exporters or dtypes):
        return list(KV_FIXTURES)
    return [
        ExportSpec(arch, exporter, dtype, cache=True)
        for arch in archs or (KV_ARCHITECTURES if all_combinations else KV_FAMILIES)
        for exporter in exporters or EXPORTERS
        for dtype in dtypes or DTYPES
    ]


def checkpoint_model_type(checkpoint: Path) -> str:
    config = checkpoint / "config.json"
    if not config.is_file():
        raise click.UsageError(f"--checkpoint {checkpoint}: no config.json there (a save_pretrained folder is meant)")
    return str(json.loads(config.read_text()).get("model_type", "model"))


def _first_line(error: Exception) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else ""


def _report(spec: ExportSpec, entry: dict[str, object]) -> str:
    calls = f"{entry['norm_calls']} norm calls ({entry['qk_norm_calls']} q/k, {entry['mla_norm_calls']} MLA)"
    if not spec.cache:
        return f"{calls}, {entry['bytes']} bytes"
    errors = entry["max_rel_error_vs_torch"]
    greedy = "match" if entry["greedy_tokens"]["match"] else "differ (fp16 near-ties; not required)"
    return (
        f"{calls}, {entry['cache']['layers']} cache layers, prefill/decode max rel error "
        f"{errors['prefill']:.1e}/{errors['decode']:.1e}, {GENERATE_TOKENS} greedy tokens {greedy}, "
        f"{entry['bytes']} bytes"
    )


@click.command(help=__doc__, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    required=True,
    help="Folder for the .onnx files and expected.json (which lists exactly this run's exports).",
)
@click.option(
    "--all", "all_combinations", is_flag=True, help="Every architecture × exporter × dtype, not the fixture set."
)
@click.option(
    "--arch",
    "archs",
    multiple=True,
    type=click.Choice(sorted(KV_ARCHITECTURES)),
    help="Only these (repeatable; mistral only with --cache).",
)
@click.option("--exporter", "exporters", multiple=True, type=click.Choice(sorted(EXPORTERS)))
@click.option("--dtype", "dtypes", multiple=True, type=click.Choice(sorted(DTYPES)))
@click.option(
    "--cache",
    is_flag=True,
    help="KV-cache exports: past_key_values.N.key/value inputs and present.N.key/value outputs (optimum's names).",
)
@click.option(
    "--checkpoint",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="With --cache: a local Hugging Face checkpoint folder (config.json + weights) instead of the tiny models.",
)
@click.option("--verbose", is_flag=True, help="Print the full traceback of a failed export.")
@click.option("--force", is_flag=True, help=FORCE_HELP)
def main(
    out_dir: Path,
    all_combinations: bool,
    archs: tuple[str, ...],
    exporters: tuple[str, ...],
    dtypes: tuple[str, ...],
    cache: bool,
    checkpoint: Path | None,
    verbose: bool,
    force: bool,
) -> None:
    if checkpoint is not None and not cache:
        raise click.UsageError("--checkpoint exports a KV-cache model: give --cache too")
    if checkpoint is not None and (archs or all_combinations):
        raise click.UsageError("--checkpoint exports that checkpoint: --arch and --all choose tiny models")
    if not cache and set(archs) - set(ARCHITECTURES):
        raise click.UsageError(f"--arch {', '.join(sorted(set(archs) - set(ARCHITECTURES)))}: only with --cache")
    if cache:
        specs = select_cache_specs(all_combinations, archs, exporters, dtypes, checkpoint)
    else:
        specs = select_specs(all_combinations, archs, exporters, dtypes)
    check_exports(out_dir, [name for spec in specs for name in (spec.filename, f"{spec.filename}.data")], force)
    out_dir.mkdir(parents=True, exist_ok=True)
    expected: dict[str, dict[str, object]] = {}
    failures: dict[str, str] = {}
    for spec in specs:
        try:
            expected[spec.filename] = _export_into(spec, out_dir)
        except Exception as error:  # one failed combination must not stop the others; it is reported below
            failures[spec.filename] = f"{type(error).__name__}: {_first_line(error)}"
            if verbose:
                traceback.print_exc()
            continue
        click.echo(f"ok      {spec.filename}: {_report(spec, expected[spec.filename])}")
        sliding = expected[spec.filename].get("cache", {}).get("full_length_sliding_layers")
        if sliding:
            click.echo(
                f"note    {spec.filename}: sliding-window layers {sliding} keep the whole past (the attention mask "
                "applies the window; transformers' own cache keeps only the window there)"
            )
    for filename, reason in failures.items():
        click.echo(f"FAILED  {filename}: {reason}")
    if expected:
        # A run that exported nothing leaves the folder as it was, its manifest included.
        manifest = {"transformers": transformers.__version__, "torch": torch.__version__, "files": expected}
        (out_dir / "expected.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    sys.exit(1 if failures else 0)


def _export_into(spec: ExportSpec, out_dir: Path) -> dict[str, object]:
    """Export `spec` into a scratch folder inside `out_dir`, then move its files into place: an export that fails
    leaves `out_dir` as it was (an earlier export of the same name included), and one that succeeds replaces it."""
    with tempfile.TemporaryDirectory(dir=out_dir, prefix=".export-") as scratch:
        entry = (export_cache_one if spec.cache else export_one)(spec, Path(scratch))
        for name in (spec.filename, f"{spec.filename}.data"):
            if (Path(scratch) / name).exists():
                os.replace(Path(scratch) / name, out_dir / name)
            else:
                # The new export keeps its weights inline: the earlier export's data file is no longer read.
                (out_dir / name).unlink(missing_ok=True)
    return entry


if __name__ == "__main__":
    main()
