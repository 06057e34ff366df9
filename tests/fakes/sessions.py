"""An engine session that runs a model in onnxruntime instead of an engine in TensorRT: where TensorRT is absent,
`compare`'s engine branch (feeds, session, verdict, report) runs around it."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from trtfuse.engine.engine_file import EngineFile
from trtfuse.verify.onnxrt import CpuSession


class OnnxrtEngineSession:
    """Stands in for `trtfuse.engine.session.EngineSession`; `runner` is what the "engine" computes."""

    runner: CpuSession

    def __init__(self, engine: EngineFile, profile_index: int | None = None, name: str = "fake") -> None:
        self.engine = engine

    def __enter__(self) -> OnnxrtEngineSession:
        # As the real session deserialises the engine on entry and destroys it on exit.
        self.runner.load()
        return self

    def __exit__(self, *exc: object) -> None:
        self.runner.release()

    def infer(self, feed: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self.runner.run(feed)

    @classmethod
    def running(cls, runner: CpuSession) -> type[OnnxrtEngineSession]:
        return type("Session", (cls,), {"runner": runner})
