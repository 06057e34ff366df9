"""`python -m trtfuse.bench.lifecycle`: every default case driven on the GPU, one line each."""

from __future__ import annotations

import sys

from trtfuse.bench.lifecycle.cases import default_cases
from trtfuse.bench.lifecycle.drive import drive


def main() -> int:
    import torch

    if not torch.cuda.is_available():
        print("trtfuse.bench.lifecycle: no CUDA device; run it on the GPU machine", file=sys.stderr)
        return 2
    failed = 0
    for case in default_cases():
        report = drive(case)
        checks = [c for run in report.runs for c in run.checks]
        worst = max((c.max_rel for c in checks), default=0.0)
        # A quantized output is judged in steps of its grid (outputs.allowed_steps), not by its relative error.
        quantized = [c for c in checks if c.allowed_steps]
        farthest = max(quantized, key=lambda c: c.max_steps, default=None)
        steps = f"  steps {farthest.max_steps}/{farthest.allowed_steps}" if farthest else ""
        status = "ok  " if report.passed else "FAIL"
        failed += not report.passed
        # A rotated output's error is measured against its allowance (outputs.rotated_check), not relatively.
        measure = "err/allowed" if case.op.rotary else "rel err"
        print(
            f"{status} {case.name:58s} worst {measure} {worst:.2e}{steps}"
            f"  enqueue {report.host.enqueue_us:6.2f} us  (kernel launch {report.host.launch_us:6.2f} us)"
        )
    return 1 if failed else 0


sys.exit(main())
