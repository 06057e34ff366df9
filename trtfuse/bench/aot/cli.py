"""AOT kernel artifacts launched with the bare CUDA driver API, as TensorRT launches the ones it embeds (issue 9).

    python -m trtfuse.bench.aot compile --out DIR [--arch ARCH] [--jobs N] [--kinds KIND...]
    python -m trtfuse.bench.aot check DIR [--json PATH]

`compile` (imports CuTeDSL) writes every artifact of the matrix (the specs of tests/gpu/test_kernels_gpu.py, add+norm
specs of tests/gpu/test_add_norm_gpu.py and quantized ones of each kind, each tactic) as `<stem>.ptx`, `<stem>.cubin`
and `<stem>.json` (the launch declaration), plus `manifest.json` (`--kinds`: only those kernel kinds' entries, e.g.
`qk_norm_rope`). `check` runs in a process that imports neither CuTeDSL
nor TVM-FFI (it blocks both and asserts it): it loads each artifact with cuModuleLoadData (the PTX, then the cubin),
launches it with cuLaunchKernel exactly as its declaration says, on torch CUDA tensors with NaN-poisoned outputs, and
compares with the float64 reference (trtfuse/bench/reference.py; add+norm's h bit for bit): 0, 1, 3, SM-count, 4097 and
16384 rows (QK-norm: that many tokens, GQA head counts), pointers one element off alignment, replays of a captured CUDA
graph, weight_mode NONE with a NaN placeholder weight (never read); rows of exact sums of squares for the rsqrt stage.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from trtfuse.bench.aot.check import check_artifacts, print_check
from trtfuse.bench.aot.compile import compile_matrix
from trtfuse.bench.aot.isolation import forbidden_imported, require_bare_process
from trtfuse.bench.aot.manifest import BadArtifactFolder
from trtfuse.bench.aot.matrix import KIND_NAMES
from trtfuse.kernels.device import current_device


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    compile_parser = commands.add_parser("compile", help="compile the matrix's artifacts (imports CuTeDSL)")
    compile_parser.add_argument("--out", type=Path, required=True, help="folder for the artifacts and manifest")
    compile_parser.add_argument("--arch", help="target architecture (default: this GPU's, or CUTE_DSL_ARCH/sm_90a)")
    compile_parser.add_argument("--jobs", type=int, default=1, help="compile processes (default 1)")
    compile_parser.add_argument("--kinds", nargs="+", choices=KIND_NAMES, help="only these kernel kinds (default: all)")
    check_parser = commands.add_parser("check", help="launch every artifact with the bare CUDA driver")
    check_parser.add_argument("folder", type=Path)
    check_parser.add_argument("--json", type=Path, help="also write every case's result here")
    args = parser.parse_args(argv)
    if args.command == "compile":
        arch = args.arch or current_device().arch
        kinds = None if args.kinds is None else tuple(args.kinds)
        manifest = compile_matrix(args.out, arch, max(1, args.jobs), kinds)
        count = sum(len(item["stems"]) for item in manifest["entries"])
        print(f"{count} artifacts for {arch} in {args.out}")
        return 0
    require_bare_process()
    if not torch.cuda.is_available():
        raise SystemExit("trtfuse.bench.aot check needs a CUDA GPU")
    try:
        report = check_artifacts(args.folder)
    except (BadArtifactFolder, FileNotFoundError) as error:
        print(f"trtfuse.bench.aot check: {error}", file=sys.stderr)
        return 2
    report["forbidden_modules_imported"] = forbidden_imported()
    print_check(report)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    ok = report["failed"] == 0 and not report["forbidden_modules_imported"] and report["cases"] > 0
    return 0 if ok else 1
