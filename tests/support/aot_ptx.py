"""What the CPU tests read in an AOT artifact's PTX: its one entry and parameters, its global accesses, and whether
it agrees with its launch declaration."""

from __future__ import annotations

import json
import re

from trtfuse.kernels import artifacts
from trtfuse.kernels.declaration import KernelArtifact, LaunchDeclaration, ParamRole

ENTRY = re.compile(r"\.visible \.entry (\w+)\((.*?)\)", re.S)


def entry_params(ptx: str) -> tuple[str, list[str]]:
    (match,) = ENTRY.finditer(ptx)
    return match.group(1), [line.strip().rstrip(",") for line in match.group(2).strip().splitlines()]


def global_accesses(ptx: str) -> set[str]:
    return set(re.findall(r"\b(?:ld|st)\.global(?:\.[A-Za-z0-9:_]+)+", ptx))


def check_artifact(artifact: KernelArtifact, arch: str) -> None:
    """The PTX is one entry whose name and parameters are the declaration's, for `arch`; the cubin is for `arch`."""
    declaration = artifact.declaration
    assert declaration.arch == arch
    assert re.search(rf"^\.target {arch}\b", artifact.ptx, re.M)
    name, params = entry_params(artifact.ptx)
    assert name == declaration.kernel_name
    # Inline in a std::string (libstdc++ keeps up to 15 characters in the object): TensorRT 10.10-10.13 read the name
    # after the string holding it was destroyed.
    assert len(name) <= artifacts.ENTRY_NAME_MAX == 15
    assert len(params) == len(declaration.params)
    for index, (text, param) in enumerate(zip(params, declaration.params, strict=True)):
        assert text.startswith(f".param {param.ptx_type}"), (text, param)
        assert text.endswith(f"{name}_param_{index}")
        assert (".ptr .global" in text) == (param.role is not ParamRole.SCALAR)
    roles = [p.role for p in declaration.params]
    # TensorRT's order: inputs, then scalars, then outputs.
    assert roles == sorted(roles, key=[ParamRole.INPUT, ParamRole.SCALAR, ParamRole.OUTPUT].index)
    assert re.search(rf"\.reqntid {declaration.block_threads}, 1, 1", artifact.ptx)
    assert artifact.cubin[:4] == b"\x7fELF"
    assert name.encode() in artifact.cubin
    assert LaunchDeclaration.from_json(json.loads(declaration.dumps())) == declaration
