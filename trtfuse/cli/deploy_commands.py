"""`trtfuse triton-config`: it prints; the configuration is `trtfuse.engine.triton`'s."""

from __future__ import annotations

from pathlib import Path

import click

from trtfuse.cli.options import HELP_OPTIONS, FilePath, common_options, echo_json


@click.command("triton-config", context_settings=HELP_OPTIONS)
@click.argument("engine_path", metavar="MODEL.engine", type=FilePath())
@click.option("--name", help="The model's name: its folder in the Triton model repository [default: left out].")
@common_options
def triton_config_command(engine_path: Path, name: str | None, as_json: bool) -> None:
    """Print the config.pbtxt that serves MODEL.engine (AOT plugins) from a Triton model repository: platform
    tensorrt_plan, every input and output with its dynamic dims, one instance group offered every profile."""
    from trtfuse.engine.engine_file import EngineFile
    from trtfuse.engine.triton import triton_config

    text = triton_config(EngineFile.open(engine_path), name)
    if as_json:
        echo_json({"engine": str(engine_path), "config_pbtxt": text})
        return
    click.echo(text, nl=False)
