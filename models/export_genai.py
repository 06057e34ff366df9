"""onnxruntime-genai's model builder on the tiny models: contrib ops, packed QKV, int4 `MatMulNBits`, KV cache.

Runs in the genai virtual environment ($VENVS/genai, models/README.md). Each model is saved with `save_pretrained`
and built by `python -m onnxruntime_genai.models.builder`, as a user would, for the CPU in fp32, fp16 and int4 and
for CUDA in fp16 (`-e cuda` builds without a GPU). The builder's own files (genai_config.json, external weights) are
folded into one self-contained .onnx per export.

\b
    $VENVS/genai/bin/python models/export_genai.py --out $EXPORTS
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import click
import onnx
from tool_exports import (
    Manifest,
    export_facts,
    export_options,
    norm_entry,
    run_tool,
    save_checkpoint,
    tiny_model,
)
from torch import nn

# (file tag) -> (dtype of the activations, builder precision, execution provider)
VARIANTS = {
    "cpu-fp32": ("float32", "fp32", "cpu"),
    "cpu-fp16": ("float16", "fp16", "cpu"),
    "cpu-int4": ("float32", "int4", "cpu"),
    "cuda-fp16": ("float16", "fp16", "cuda"),
}


# The builder takes the first Linear whose output width is the vocabulary for the LM head: with export.py's 128
# tokens that is layer 0's q_proj (2 heads x 64), and the graph's logits come from layer 0 (measured: 0.67 max rel
# error against torch). 160 is no projection's width of export.py's configs; model_for_builder moves off it for others.
VOCABULARY = 160
# GroupQueryAttention's optional inputs 14 and 15: the q and k norm weights, where the builder put the norms inside.
GQA_NORM_WEIGHT_INPUTS = (14, 15)


def absorbed_qk_norms(graph: onnx.ModelProto) -> int:
    """Norm module calls that the builder moved into GroupQueryAttention: no norm node is left to fuse for them."""
    return sum(
        1
        for node in graph.graph.node
        if node.op_type == "GroupQueryAttention"
        for index in GQA_NORM_WEIGHT_INPUTS
        if len(node.input) > index and node.input[index]
    )


def model_for_builder(arch: str) -> tuple[nn.Module, int]:
    """The tiny model with a vocabulary no other Linear is as wide as, and that vocabulary.

    The builder takes every Linear of the vocabulary's width for the LM head (`has_lm_head`) and the first one wins,
    so the logits would come from that layer and the layers after it would be dead code (Phi-3 with intermediate 80:
    gate_up_proj is 160 wide; with hidden 80, qkv_proj is). VOCABULARY fits export.py's default widths only.
    """
    vocabulary = VOCABULARY
    while True:
        model = tiny_model(arch, "float32", vocabulary=vocabulary)
        widths = {
            module.out_features
            for name, module in model.named_modules()
            if isinstance(module, nn.Linear) and name.rsplit(".", 1)[-1] != "lm_head"
        }
        if vocabulary not in widths:
            return model, vocabulary
        vocabulary += 32


def export(arch: str, variant: str, path: Path) -> dict[str, object]:
    dtype, precision, provider = VARIANTS[variant]
    model, vocabulary = model_for_builder(arch)
    entry = norm_entry(model, arch, dtype, variant=variant, precision=precision, execution_provider=provider)
    entry["vocabulary"] = vocabulary
    with tempfile.TemporaryDirectory() as scratch:
        checkpoint = Path(scratch) / "checkpoint"
        if hasattr(model.config, "original_max_position_embeddings"):
            # Phi-3: the builder takes a context length other than the original one for LongRoPE and then wants
            # its scaling factors (`KeyError: 'multi_cache'`); without rope scaling the two lengths mean the same.
            model.config.original_max_position_embeddings = model.config.max_position_embeddings
        save_checkpoint(model, checkpoint)
        built = Path(scratch) / "built"
        cache = Path(scratch) / "cache"
        command = [
            sys.executable, "-m", "onnxruntime_genai.models.builder",
            "-i", str(checkpoint), "-o", str(built), "-p", precision, "-e", provider, "-c", str(cache),
        ]  # fmt: skip
        run_tool(command)
        graph = onnx.load(str(built / "model.onnx"))
        onnx.save(graph, str(path))
    entry["inputs"] = [value.name for value in graph.graph.input]
    entry["contrib_ops"] = sorted({node.op_type for node in graph.graph.node if node.domain == "com.microsoft"})
    entry["absorbed_norm_calls"] = absorbed_qk_norms(graph)
    return entry | export_facts(model, graph, path)


@click.command(help=__doc__, context_settings={"help_option_names": ["-h", "--help"]})
@export_options(VARIANTS)
def main(out_root: Path, archs: tuple[str, ...], variants: tuple[str, ...], verbose: bool, force: bool) -> None:
    Manifest("genai", out_root / "genai", force=force).attempt_all(archs, variants or VARIANTS, export, verbose)


if __name__ == "__main__":
    main()
