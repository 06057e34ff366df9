"""Copy the one committed fixture per tool from an export run into models/fixtures/tools/, with its expected counts.

Each pick is the export of its tool that exercises the most of what issue 12 found there (see models/README.md):

A pick the export run lacks keeps its committed file and entry (and is listed, exit status 1), so one tool's
exports are enough to refresh that tool's fixtures.

\b
    python models/copy_fixtures.py $EXPORTS                  # -> models/fixtures/tools/ + expected.json
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import click

DESTINATION = Path(__file__).resolve().parent / "fixtures" / "tools"
# tool -> file: KV cache with mixed-precision norms and q/k norms; onnxruntime's fused SimplifiedLayerNormalization
# without value_info; packed QKV with int4 MatMulNBits; Q/DQ around the projections; opset-23 RMSNormalization
# with a bf16 input and float32 scale/output (the fp16 one does not load in onnxruntime); onnxslim's rewrite of
# the optimum export; ModelOpt's FP8 with a KV cache; ModelOpt's INT8 Gemma3, whose q/k norms each have an output
# Q of their own scale (a TrtfuseQkNormQuant) and whose other norms an inverse-root pair; and ModelOpt's INT8 of
# optimum's OLMo2 export (KV cache), whose full-width q and k norms of different widths each have an input pair and
# an inverse-root pair of their own (a TrtfuseQkNormQuant).
PICKS = {
    "optimum": "qwen3-optimum-fp16.onnx",
    "optimum-O2": "llama-optimum-fp16-O2.onnx",
    "genai": "qwen3-genai-cpu-int4.onnx",
    "modelopt": "qwen3-modelopt-int8-fp16.onnx",
    "dynamo23": "olmo2-dynamo23-bf16.onnx",
    "onnxslim": "qwen3-optimum-fp16-slim.onnx",
    "modelopt-fp8-kv": "qwen3-modelopt-fp8-kv.onnx",
    "modelopt-int8-qk": "gemma3-modelopt-int8-fp16.onnx",
    "modelopt-int8-qk-rsqrt": "olmo2-modelopt-int8-fp16-optimum.onnx",
}
# The folder each pick's manifest lives in, where it is not the pick's own tool name.
FOLDERS = {
    "optimum-O2": "optimum",
    "modelopt-fp8-kv": "modelopt",
    "modelopt-int8-qk": "modelopt",
    "modelopt-int8-qk-rsqrt": "modelopt",
}
MAX_BYTES = 2**20


@click.command(help=__doc__, context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("exports", type=click.Path(exists=True, file_okay=False, path_type=Path))
def main(exports: Path) -> None:
    DESTINATION.mkdir(parents=True, exist_ok=True)
    committed = DESTINATION / "expected.json"
    previous = json.loads(committed.read_text())["files"] if committed.exists() else {}
    files = {name: previous[name] for name in PICKS.values() if name in previous}
    missing = []
    found = []
    for tool, name in PICKS.items():
        folder = exports / FOLDERS.get(tool, tool)
        listing = folder / "expected.json"
        manifest = json.loads(listing.read_text()) if listing.exists() else {"files": {}}
        if name not in manifest["files"]:
            missing.append(f"{folder / name}")
            continue
        size = (folder / name).stat().st_size
        if size >= MAX_BYTES:
            raise click.ClickException(f"{folder / name} is {size} bytes, over the {MAX_BYTES}-byte fixture limit")
        found.append((folder / name, {**manifest["files"][name], "bytes": size, "versions": manifest["versions"]}))
    for path, entry in found:
        shutil.copyfile(path, DESTINATION / path.name)
        files[path.name] = entry
    committed.write_text(json.dumps({"files": files}, indent=2, sort_keys=True) + "\n")
    click.echo(f"{len(files)} fixtures -> {DESTINATION}")
    if missing:
        raise click.ClickException(f"not exported (committed copies kept): {', '.join(missing)}")


if __name__ == "__main__":
    main()
