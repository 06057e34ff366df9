"""Compare every export listed in OUT/<tool>/expected.json with its torch model again, and record the error there.

For exports made before their script compared them (`onnxruntime_vs_torch`), or after a change to the comparison.
Run it with the tool's own environment: the tiny models are rebuilt from their seed, and another transformers
version may draw other random weights.

\b
    $VENVS/optimum/bin/python models/verify_exports.py $EXPORTS --tool optimum
"""

from __future__ import annotations

from pathlib import Path

import click
from tool_exports import Manifest, onnxruntime_vs_torch, tiny_model


@click.command(help=__doc__, context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("out_root", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--tool", required=True, help="The folder under OUT_ROOT whose exports are compared.")
def main(out_root: Path, tool: str) -> None:
    manifest = Manifest(tool, out_root / tool)
    for name, entry in sorted(manifest.files.items()):
        vocabulary = entry.get("vocabulary")
        model = tiny_model(
            str(entry["architecture"]), "float32", vocabulary=None if vocabulary is None else int(vocabulary)
        )
        entry["onnxruntime_vs_torch"] = onnxruntime_vs_torch(model, manifest.out_dir / name)
        click.echo(f"{name}: {entry['onnxruntime_vs_torch']}")
    manifest.write()


if __name__ == "__main__":
    main()
