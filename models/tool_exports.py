"""What every per-tool export script shares: the tiny models of export.py, their norm-call counts, the manifest.

Each tool script (export_optimum.py, export_genai.py, export_modelopt.py, export_dynamo23.py, export_onnxslim.py)
runs in its own virtual environment (models/README.md) and writes its files and one `expected.json` into
`OUT/<tool>/`. The manifest has the same per-file keys as fixtures/expected.json plus `tool`, `variant` and `source`
(the export a post-processing tool started from), so `survey.py` can run trtfuse on every file and compare.
"""

from __future__ import annotations

import json
import subprocess
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from importlib import metadata
from pathlib import Path

import click
import numpy as np
import onnx
import onnxruntime

# export.py sets HF_HUB_OFFLINE before it imports transformers, and says which extra to install when torch is missing.
from export import ARCHITECTURES as EXPORT_ARCHITECTURES
from export import (
    HEADS,
    KV_ARCHITECTURES,
    SAMPLE_BATCH,
    SAMPLE_SEQUENCE,
    Architecture,
    _common,
    build_model,
    count_norm_calls,
    random_input_ids,
)
from extras import FORCE_HELP, MANIFEST, check_exports, exit_missing, is_manifest

try:
    import torch
    from torch import nn
    from transformers import PhiConfig, PretrainedConfig
except ModuleNotFoundError as missing:
    exit_missing(missing)


def _phi() -> PretrainedConfig:
    # Phi-2: nn.LayerNorm with a bias, partial rotary; a negative like GPT-2. As many key/value heads as heads, like
    # the real Phi-2: optimum's Phi export assumes that ("Sizes of tensors must match" with 1 key/value head).
    common = {**_common(), "num_key_value_heads": HEADS}
    return PhiConfig(**common, layer_norm_eps=1e-5, pad_token_id=0, bos_token_id=1, eos_token_id=2)


# export.py's families plus the two issue 12 names that export.py does not build.
ARCHITECTURES = {
    **EXPORT_ARCHITECTURES,
    "mistral": KV_ARCHITECTURES["mistral"],
    "phi": Architecture("phi", _phi, 1.0, False, 1e-5),
}

# The families of issue 12: every RMSNorm family, and the LayerNorm negatives that must come out with nothing fused.
RMS_FAMILIES = ("llama", "mistral", "phi3", "qwen3", "gemma3", "olmo2")
NEGATIVES = ("gpt2", "phi")


FORCE_OPTION = click.option("--force", is_flag=True, help=FORCE_HELP)


def export_options(variants: Sequence[str]) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """The options every per-tool export script takes: --out, --arch, --variant (one of `variants`), --verbose,
    --force."""

    def decorate(command: Callable[..., None]) -> Callable[..., None]:
        options = (
            click.option("--out", "out_root", type=click.Path(file_okay=False, path_type=Path), required=True),
            click.option("--arch", "archs", multiple=True, help="Only these families (repeatable)."),
            click.option("--variant", "variants", multiple=True, type=click.Choice(sorted(variants))),
            click.option("--verbose", is_flag=True, help="Print the full traceback of a failed export."),
            FORCE_OPTION,
        )
        for option in reversed(options):
            command = option(command)
        return command

    return decorate


@dataclass
class Manifest:
    """`OUT/<tool>/expected.json`: one entry per written file, and the reason for each combination that failed.
    `force`: an export may replace a file in the folder the manifest does not list (never an ONNX model)."""

    tool: str
    out_dir: Path
    files: dict[str, dict[str, object]] = field(default_factory=dict)
    failures: dict[str, str] = field(default_factory=dict)
    force: bool = False

    def __post_init__(self) -> None:
        """Starts from the folder's previous manifest, so a run of a few combinations keeps the others' entries."""
        self.check(())
        self.out_dir.mkdir(parents=True, exist_ok=True)
        listing = self.out_dir / MANIFEST
        # Not a manifest: --force let this run replace it, and nothing is read from it.
        previous = json.loads(listing.read_text()) if is_manifest(listing) else {}
        self.files.update(previous.get("files", {}))
        self.failures.update(previous.get("failures", {}))

    def check(self, names: Sequence[str]) -> None:
        """Before anything is written: `names` and the manifest may replace only what the manifest lists (or, with
        `force`, a file that is no ONNX model); else one line and exit status 2 (`extras.check_exports`)."""
        check_exports(self.out_dir, names, self.force)

    def attempt(self, name: str, export: Callable[[], dict[str, object]], verbose: bool = False) -> None:
        """Runs one export; a failure is recorded with its first line and does not stop the others."""
        self.files.pop(name, None)
        self.failures.pop(name, None)
        (self.out_dir / name).unlink(missing_ok=True)
        try:
            entry = export()
        except Exception as error:  # each tool fails in its own ways; every failure is reported, none stops the run
            self.failures[name] = f"{type(error).__name__}: {first_line(error)}"
            (self.out_dir / name).unlink(missing_ok=True)
            if verbose:
                traceback.print_exc()
            print(f"FAILED  {self.tool}/{name}: {self.failures[name]}", flush=True)
            self.write()
            return
        self.files[name] = {"tool": self.tool, **entry}
        self.write()
        calls = f"{entry['norm_calls']} norm calls ({entry['qk_norm_calls']} q/k)"
        print(f"ok      {self.tool}/{name}: {calls}", flush=True)

    def attempt_all(
        self,
        archs: Sequence[str],
        variants: Sequence[str],
        export: Callable[[str, str, Path], dict[str, object]],
        verbose: bool = False,
        tag: Callable[[str], str] = str,
    ) -> None:
        """`export(arch, variant, path)` for every family (all of them when `archs` is empty) and variant, into
        `<arch>-<tool>-<tag(variant)>.onnx`, then the manifest; every file checked first (`check`)."""
        names = {
            f"{arch}-{self.tool}-{tag(variant)}.onnx": (arch, variant)
            for arch in archs or (*RMS_FAMILIES, *NEGATIVES)
            for variant in variants
        }
        self.check(list(names))
        for name, (arch, variant) in names.items():
            path = self.out_dir / name
            self.attempt(name, lambda arch=arch, variant=variant, path=path: export(arch, variant, path), verbose)
        self.write()

    def write(self) -> None:
        payload = {"tool": self.tool, "versions": tool_versions(), "files": self.files, "failures": self.failures}
        (self.out_dir / MANIFEST).write_text(json.dumps(payload, indent=2, sort_keys=True) + "\n")


def first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else ""


def tool_versions() -> dict[str, str]:
    versions = {}
    for package in (
        "torch",
        "transformers",
        "onnx",
        "onnxruntime",
        "optimum-onnx",
        "onnxruntime-genai",
        "nvidia-modelopt",
        "onnxslim",
        "onnxscript",
    ):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            continue
    return versions


def tiny_model(arch: str, dtype: str, vocabulary: int | None = None) -> nn.Module:
    """The Hugging Face model of export.py's tiny config (random, norm weights != 1), without the logits wrapper;
    `vocabulary` replaces export.py's 128 tokens where a tool mistakes a 128-wide projection for the LM head."""
    spec = ARCHITECTURES[arch]
    if vocabulary is not None:
        spec = replace(spec, build_config=partial(_with_vocabulary, spec.build_config, vocabulary))
    return build_model(spec, dtype).model


def _with_vocabulary(build_config: Callable[[], PretrainedConfig], vocabulary: int) -> PretrainedConfig:
    config = build_config()
    config.vocab_size = vocabulary
    return config


def onnxruntime_vs_torch(model: nn.Module, path: Path) -> str:
    """Max rel error of onnxruntime's logits against torch's for a prefill of 5 tokens at batch 1 (empty KV cache),
    or onnxruntime's refusal: catches an export that computes something else than the model."""
    input_ids = random_input_ids(1, 5, seed=1)
    with torch.no_grad():
        expected = model(input_ids).logits.float().numpy()
    try:
        session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        config = model.config
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        feed = {value.name: _prefill_input(value, input_ids.numpy(), head_dim) for value in session.get_inputs()}
        (logits,) = session.run(["logits"], feed)
    except Exception as error:  # onnxruntime's refusal is the finding
        return f"onnxruntime fails: {first_line(error)}"
    logits = np.asarray(logits, dtype=np.float32)
    return f"{np.abs(logits - expected).max() / np.abs(expected).max():.2e}"


def export_facts(model: nn.Module, graph: onnx.ModelProto, path: Path) -> dict[str, object]:
    """What every tool's manifest entry records of an export written to `path`: its default-domain opset, how far
    onnxruntime's logits are from torch's, and its size."""
    return {
        "opset": next(o.version for o in graph.opset_import if o.domain in ("", "ai.onnx")),
        "onnxruntime_vs_torch": onnxruntime_vs_torch(model, path),
        "bytes": path.stat().st_size,
    }


def _prefill_input(value: object, input_ids: np.ndarray, head_dim: int) -> np.ndarray:
    if value.name == "input_ids":
        return input_ids
    if value.name == "position_ids":
        return np.arange(input_ids.shape[1], dtype=np.int64)[None]
    if "mask" in value.name:
        return np.ones_like(input_ids)
    if value.name.startswith("past_key_values"):
        # [batch, kv heads, past length, head dim]: batch 1, past length 0, and the head dim where it is symbolic.
        prefill = (1, None, 0, head_dim)
        shape = [dim if isinstance(dim, int) else prefill[index] for index, dim in enumerate(value.shape)]
        return np.zeros(shape, dtype=np.float16 if value.type == "tensor(float16)" else np.float32)
    raise ValueError(f"no prefill value for input {value.name!r}")


def norm_entry(model: nn.Module, arch: str, dtype: str, **extra: object) -> dict[str, object]:
    """The expected counts for one export: the norm module calls of one forward pass, counted with forward hooks."""
    calls = count_norm_calls(model, random_input_ids(SAMPLE_BATCH, SAMPLE_SEQUENCE, seed=0))
    spec = ARCHITECTURES[arch]
    return {
        "architecture": arch,
        "dtype": dtype,
        "epsilon": spec.epsilon if spec.uses_rms_norm else None,
        "norm_calls": calls.total,
        "qk_norm_calls": calls.qk,
        "mla_norm_calls": calls.mla,
        "add_norm_calls": calls.residual,
        "uses_rms_norm": spec.uses_rms_norm,
        **extra,
    }


def save_checkpoint(model: nn.Module, folder: Path) -> None:
    """`save_pretrained` plus a word-level tokenizer over the tiny vocabulary, which the genai builder insists on."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    model.save_pretrained(folder)
    vocabulary = {f"t{index}": index for index in range(model.config.vocab_size)}
    backend = Tokenizer(models.WordLevel(vocab=vocabulary, unk_token="t0"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="t0", bos_token="t1", eos_token="t2")
    tokenizer.save_pretrained(folder)


def run_tool(command: list[str], env: Mapping[str, str] | None = None) -> None:
    """Runs one tool's command line (in `env`, else this process's environment); a failure raises with the tool's
    own last error line."""
    result = subprocess.run(command, capture_output=True, text=True, env=env)
    if result.returncode == 0:
        return
    for text in (result.stderr, result.stdout):
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        if lines:
            raise RuntimeError(lines[-1])
    raise RuntimeError(f"{Path(command[0]).name} exited with {result.returncode}")


if __name__ == "__main__":
    # A library of the export_*.py scripts, not a command: `-h` (or any argument) prints what it is.
    print(__doc__)
