"""One call each of our RMSNorm (the table's tiling and any extra tilings) and torch.compile's, for a profiler.

    ncu --clock-control none -k regex:'rms_norm|triton' python3 benchmarks/profile_kernels.py 8192 8192 bfloat16

Every kernel runs twice on fresh random data (the profiler then reports the second, warm call as well as the first);
nothing is timed here: the numbers come from the profiler.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch

from trtfuse.bench.kernels import EPS, fresh_compile
from trtfuse.contract import NormParams, WeightMode
from trtfuse.kernels.cache import KernelCache
from trtfuse.kernels.compiler import RmsNormVariant
from trtfuse.kernels.device import current_device
from trtfuse.kernels.specs import RmsNormSpec
from trtfuse.kernels.tiling import Regime, RowTiling, full_vector, row_tiling


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rows", type=int)
    parser.add_argument("hidden", type=int)
    parser.add_argument("dtype", choices=("bfloat16", "float16", "float32"))
    parser.add_argument("--tiling", nargs="*", default=[], help="extra tilings as THREADS:ROWS:REREAD:MINBLOCKS")
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    vector = full_vector(args.hidden, dtype.itemsize)
    tilings = [row_tiling(args.hidden, vector, Regime.PREFILL, dtype.itemsize)]
    for text in args.tiling:
        threads, rows, reread, floor = (int(v) for v in text.split(":"))
        vectors = -(-(args.hidden // vector) // threads)
        tilings.append(RowTiling(args.hidden, vector, threads, vectors, rows, floor, reread=bool(reread)))
    spec = RmsNormSpec(args.hidden, args.dtype, args.dtype, NormParams(EPS, 0.0, WeightMode.AFTER_CAST))
    cache = KernelCache(Path(tempfile.mkdtemp()))
    x = torch.randn(args.rows, args.hidden, device="cuda", dtype=dtype)
    w = torch.randn(args.hidden, device="cuda", dtype=dtype)
    y = torch.empty_like(x)
    stream = torch.cuda.current_stream().cuda_stream
    for tiling in tilings:
        fn = cache.get(RmsNormVariant(spec, tiling, current_device().arch))
        for _ in range(2):
            x.normal_()
            fn(x.data_ptr(), w.data_ptr(), y.data_ptr(), args.rows, stream)
    compiled = fresh_compile()
    for _ in range(2):
        x.normal_()
        compiled(x, w)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
