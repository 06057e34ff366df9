"""Export tiny, randomly initialised Hugging Face LLMs to ONNX and record how many norms each forward pass runs.

Every model is built from a config written here (no hub access), with 2 layers, hidden size 64 and a 128-token
vocabulary, so one export is a few hundred kB. The norm weights get random non-trivial values so a fusion that
drops or misplaces the weight changes the numerics. Each model is exported with the TorchScript exporter at opset 17
and the dynamo exporter at opset 18, in fp32 and fp16, with dynamic batch and sequence dims on `input_ids` and the
logits as the only output. `expected.json` records, per file, how many RMSNorm module calls one forward pass makes:
the number of norms the fusion pass must find.

\b
    python models/export.py --out models/fixtures          # the committed fixture set
    python models/export.py --out /tmp/all --all           # every architecture × exporter × dtype
    python models/export.py --out /tmp/q --arch qwen3 --exporter dynamo --dtype float16
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import json
import sys
import traceback
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import click
import numpy as np
import onnx
import onnxruntime
import torch
import transformers
from torch import nn
from transformers import (
    AutoModelForCausalLM,
    CohereConfig,
    DeepseekV3Config,
    Gemma3TextConfig,
    GPT2Config,
    LlamaConfig,
    Olmo2Config,
    Phi3Config,
    PretrainedConfig,
    Qwen3Config,
)

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


@dataclass(frozen=True)
class ExportSpec:
    arch: str
    exporter: str
    dtype: str

    @property
    def opset(self) -> int:
        return EXPORTERS[self.exporter]

    @property
    def filename(self) -> str:
        return f"{self.arch}-{self.exporter}-{DTYPE_TAGS[self.dtype]}.onnx"


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


def count_norm_calls(model: nn.Module, input_ids: torch.Tensor) -> NormCalls:
    """Counts the RMSNorm module calls of one forward pass, and among them the q/k and MLA latent norms."""
    calls = {"total": 0, "qk": 0, "mla": 0}
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

        def hook(_module: nn.Module, _args: object, _output: object, kinds: list[str] = kinds) -> None:
            for kind in kinds:
                calls[kind] += 1

        handles.append(module.register_forward_hook(hook))
    try:
        with torch.no_grad():
            model(input_ids)
    finally:
        for handle in handles:
            handle.remove()
    return NormCalls(**calls)


def random_input_ids(batch: int, sequence: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (batch, sequence), generator=generator)


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
        "uses_rms_norm": arch.uses_rms_norm,
        "bytes": path.stat().st_size,
        "max_rel_error_vs_torch": error,
    }


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


def _first_line(error: Exception) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else ""


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
    "--arch", "archs", multiple=True, type=click.Choice(sorted(ARCHITECTURES)), help="Only these (repeatable)."
)
@click.option("--exporter", "exporters", multiple=True, type=click.Choice(sorted(EXPORTERS)))
@click.option("--dtype", "dtypes", multiple=True, type=click.Choice(sorted(DTYPES)))
@click.option("--verbose", is_flag=True, help="Print the full traceback of a failed export.")
def main(
    out_dir: Path,
    all_combinations: bool,
    archs: tuple[str, ...],
    exporters: tuple[str, ...],
    dtypes: tuple[str, ...],
    verbose: bool,
) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    expected: dict[str, dict[str, object]] = {}
    failures: dict[str, str] = {}
    for spec in select_specs(all_combinations, archs, exporters, dtypes):
        try:
            expected[spec.filename] = export_one(spec, out_dir)
        except Exception as error:  # one failed combination must not stop the others; it is reported below
            (out_dir / spec.filename).unlink(missing_ok=True)
            failures[spec.filename] = f"{type(error).__name__}: {_first_line(error)}"
            if verbose:
                traceback.print_exc()
            continue
        entry = expected[spec.filename]
        calls = f"{entry['norm_calls']} norm calls ({entry['qk_norm_calls']} q/k, {entry['mla_norm_calls']} MLA)"
        click.echo(f"ok      {spec.filename}: {calls}, {entry['bytes']} bytes")
    for filename, reason in failures.items():
        click.echo(f"FAILED  {filename}: {reason}")
    manifest = {"transformers": transformers.__version__, "torch": torch.__version__, "files": expected}
    (out_dir / "expected.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
