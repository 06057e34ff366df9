"""Why a plugin creation failed: TensorRT's binding prints the creator's exception and gives the ONNX parser a null
plugin, whose message ("Could not create the plugin") does not say why; the creators record it here and the build
reads it back to name the node and the field at fault."""

from __future__ import annotations

_creation_errors: list[str] = []


def record_creation_error(message: str) -> None:
    _creation_errors.append(message)


def take_creation_errors() -> list[str]:
    """The messages of plugin creations that failed since the last call, oldest first."""
    taken = list(_creation_errors)
    _creation_errors.clear()
    return taken
