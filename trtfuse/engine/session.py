"""One engine session: a trtfuse engine deserialised through Polygraphy's TrtRunner, readied for its plugin kind
(`tensorrt.tensorrt_for`), each feed run in the optimisation profile that holds it. `run`, `compare`, the leak check
and `polygraphy run --trtfuse` all run engines through it; what fails is one line naming the engine.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable, Iterator, Mapping
from types import TracebackType
from typing import Any

import numpy as np

from trtfuse.engine.engine_file import EngineFile
from trtfuse.engine.profiles import profile_for_feed
from trtfuse.engine.tensorrt import import_tensorrt, tensorrt_for
from trtfuse.errors import MissingDependencyError, TrtfuseError, first_line

ENGINE_RUNNER = "tensorrt-engine"
POLYGRAPHY_HINT = "running an engine takes Polygraphy's TrtRunner; install it with `pip install polygraphy`"


def _one_line(engine: EngineFile, what: str, error: BaseException) -> TrtfuseError:
    """A Polygraphy failure as one line; a trtfuse error raised inside Polygraphy (the loader's) as itself."""
    if isinstance(error.__cause__, TrtfuseError):
        return error.__cause__
    return TrtfuseError(f"{engine.path}: {what}: {first_line(error)}")


class EngineSession:
    """A context manager over one execution context of `engine`. With `profile_index` it stays in that profile;
    without, each feed switches to the first profile whose ranges hold it. On leaving, the context, the engine and
    its runtime are destroyed and collected."""

    def __init__(self, engine: EngineFile, profile_index: int | None = None, name: str = ENGINE_RUNNER) -> None:
        self.engine = engine
        self._fixed_profile = profile_index
        self._profile = profile_index or 0
        self.name = name
        self.runner: Any = None

    def __enter__(self) -> EngineSession:
        import_tensorrt()
        try:
            from polygraphy.backend.trt import TrtRunner
            from polygraphy.exception import PolygraphyException
        except ImportError:
            raise MissingDependencyError(POLYGRAPHY_HINT) from None
        runner = TrtRunner(self._load, name=self.name, optimization_profile=self._profile)
        try:
            runner.activate()
        except PolygraphyException as error:
            raise _one_line(self.engine, "TensorRT could not load the engine", error) from None
        self.runner = runner
        return self

    def _load(self) -> object:
        tensorrt_for(self.engine)
        from polygraphy.backend.common import BytesFromPath
        from polygraphy.backend.trt import EngineFromBytes
        from polygraphy.exception import PolygraphyException

        try:
            return EngineFromBytes(BytesFromPath(str(self.engine.path)))()
        except PolygraphyException as error:
            raise TrtfuseError(
                f"{self.engine.path}: TensorRT cannot deserialise the engine ({first_line(error)}); its sidecar "
                "records the TensorRT version and GPU it was built for"
            ) from None

    def infer(self, feed: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The engine's outputs on `feed`, copied to host arrays of their own."""
        from polygraphy.exception import PolygraphyException

        if self._fixed_profile is None:
            index = profile_for_feed(self.engine.profiles, feed)
            if index != self._profile:
                self.runner.set_profile(index)
                self._profile = index
        try:
            outputs = self.runner.infer(dict(feed))
        except PolygraphyException as error:
            raise _one_line(self.engine, "inference failed", error) from None
        # Copies: TrtRunner hands out the same host buffers again on the next inference.
        return {name: np.array(array, copy=True) for name, array in outputs.items()}

    def last_inference_time(self) -> float:
        return self.runner.last_inference_time()

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        if self.runner is not None:
            self.runner.deactivate()
            self.runner = None
            gc.collect()


@contextlib.contextmanager
def engine_steps(
    engine: EngineFile, notify: Callable[[str], None] | None = None
) -> Iterator[Callable[[Mapping[str, np.ndarray]], dict[str, np.ndarray]]]:
    """The engine's step function (`EngineSession.infer`: each feed in the profile that holds it), the engine loaded
    on entry, when `notify` hears so, and destroyed on exit; Polygraphy's log kept quiet: trtfuse prints its own
    report and error line, and Polygraphy's, even its critical line, would repeat them."""
    if notify is not None:
        notify(f"loading the engine in TensorRT: {engine.path}")
    with _polygraphy_quiet(), EngineSession(engine) as session:
        yield session.infer


@contextlib.contextmanager
def _polygraphy_quiet() -> Iterator[None]:
    try:
        from polygraphy.logger import G_LOGGER
    except ImportError:
        yield
        return
    with G_LOGGER.verbosity(G_LOGGER.CRITICAL + 1):
        yield
