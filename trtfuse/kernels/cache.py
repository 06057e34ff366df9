"""Compile cache: one compilation per variant, kept in memory and as object files on disk.

The on-disk folder is keyed by trtfuse version, cutlass-dsl version, GPU architecture and a digest of the kernel
sources (so an edited kernel never loads its stale object files); inside it each variant is one object file named
by a hash of the variant, so a second process loads (JIT-links) instead of compiling.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import os
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cutlass.cute.runtime import load_module

import trtfuse
from trtfuse.kernels.compiler import Variant, compile_variant

CACHE_ENV = "TRTFUSE_KERNEL_CACHE"


def default_cache_root() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "trtfuse" / "kernels")


# The modules whose text decides the generated code.
_KERNEL_SOURCES = (
    "norm_kernel.py",
    "quant.py",
    "ptx.py",
    "tiling.py",
    "compiler.py",
    "specs.py",
    "artifacts.py",
    "declaration.py",
)


@functools.cache
def kernel_sources_digest() -> str:
    digest = hashlib.sha256()
    for name in _KERNEL_SOURCES:
        digest.update((Path(__file__).parent / name).read_bytes())
    return digest.hexdigest()[:12]


def cache_folder(root: Path, arch: str) -> Path:
    dsl_version = importlib.metadata.version("nvidia-cutlass-dsl")
    return root / f"trtfuse-{trtfuse.__version__}_cutlass-dsl-{dsl_version}_{arch}_src-{kernel_sources_digest()}"


def variant_key(variant: Variant) -> str:
    """A file-name-safe digest of everything that shapes the machine code (the dataclasses' reprs are exhaustive)."""
    return hashlib.sha256(repr(variant).encode()).hexdigest()[:24]


class KernelCache:
    """Variant -> callable TVM-FFI function. Thread-safe; compiles or loads each variant once per process."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = root if root is not None else default_cache_root()
        self._functions: dict[Variant, Any] = {}
        self._lock = threading.Lock()
        self.compiled = 0  # counters for tests and the benchmark: what this process had to build or load
        self.loaded = 0

    def get(self, variant: Variant) -> Any:
        function = self._functions.get(variant)
        if function is None:
            with self._lock:
                function = self._functions.get(variant)
                if function is None:
                    function = self._load_or_compile(variant)
                    self._functions[variant] = function
        return function

    def path_for(self, variant: Variant) -> Path:
        return cache_folder(self.root, variant.arch) / f"{variant_key(variant)}.o"

    def _load_or_compile(self, variant: Variant) -> Any:
        path = self.path_for(variant)
        symbol = f"trtfuse_{variant_key(variant)}"
        if path.exists():
            self.loaded += 1
            return getattr(load_module(str(path), enable_tvm_ffi=True), symbol)
        function = compile_variant(variant)
        self.compiled += 1
        write_cache_file(path, lambda tmp: function.export_to_c(str(tmp), function_name=symbol))
        return function


def write_cache_file(path: Path, write: Callable[[Path], None]) -> None:
    """Have `write` fill a temporary file beside `path`, then rename it into place, so a concurrent process never
    loads a half-written file. The cache keeps its own writer rather than trtfuse.files': a cache entry must
    outlive a command whose outputs are rolled back."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=path.suffix, dir=path.parent)
    os.close(fd)
    try:
        write(Path(tmp))
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
