"""Polygraphy runners for the two trtfuse sides of a comparison: the fused model lowered to standard ops in
onnxruntime (`trtfuse check`'s `CpuSession`), and the trtfuse engine in TensorRT (`trtfuse run`'s `TrtRunner`,
switched per feed to the optimisation profile that holds it). Their names start with `trtfuse-`, so Polygraphy's
log and comparison say which side is which."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np
from polygraphy import util
from polygraphy.backend.base import BaseRunner
from polygraphy.common import TensorMetadata
from polygraphy.datatype import DataType

from trtfuse.engine.engine_file import EngineFile
from trtfuse.engine.session import EngineSession
from trtfuse.model.interface import fed_inputs
from trtfuse.model.onnx_file import LoadedModel
from trtfuse.polygraphy_ext.errors import as_polygraphy_error
from trtfuse.verify.onnxrt import CpuSession

ONNXRT_PREFIX = "trtfuse-onnxrt-runner"
TRT_PREFIX = "trtfuse-trt-runner"


class FusedOnnxrtRunner(BaseRunner):
    """Runs a model (the lowered fused model of `LowerFusedNodes`) exactly as `trtfuse check` runs it: onnxruntime on
    the CPU without graph optimisations, every 16-bit value rounded where the graph says, bfloat16 graphs in onnx's
    reference evaluator."""

    def __init__(self, model: LoadedModel | Callable[[], LoadedModel], name: str | None = None) -> None:
        super().__init__(name=name, prefix=ONNXRT_PREFIX)
        self._model = model

    @util.check_called_by("activate")
    def activate_impl(self) -> None:
        self.model, _ = util.invoke_if_callable(self._model)
        self.runner = CpuSession(self.model)

    @util.check_called_by("get_input_metadata")
    def get_input_metadata_impl(self) -> TensorMetadata:
        meta = TensorMetadata()
        for value in fed_inputs(self.model.model):
            tensor = value.type.tensor_type
            shape = [dim.dim_value if dim.HasField("dim_value") else dim.dim_param or None for dim in tensor.shape.dim]
            meta.add(value.name, DataType.from_dtype(tensor.elem_type, "onnx"), shape)
        return meta

    @util.check_called_by("infer")
    def infer_impl(self, feed_dict: Mapping[str, np.ndarray]) -> OrderedDict:
        start = time.perf_counter()
        with as_polygraphy_error(self.name):
            outputs = self.runner.run(feed_dict)
        self.inference_time = time.perf_counter() - start
        return OrderedDict(outputs)

    @util.check_called_by("deactivate")
    def deactivate_impl(self) -> None:
        del self.runner
        del self.model


class TrtfuseTrtRunner(BaseRunner):
    """Runs a trtfuse engine (an opened `EngineFile`, or the path `BuildTrtfuseEngine` returns) in an
    `EngineSession`, as `trtfuse run` and `trtfuse compare` do: the plugins its kind needs registered first, each feed
    in the first optimisation profile whose ranges hold it."""

    def __init__(self, engine: EngineFile | str | Callable[[], str], name: str | None = None) -> None:
        super().__init__(name=name, prefix=TRT_PREFIX)
        self._engine = engine

    @util.check_called_by("activate")
    def activate_impl(self) -> None:
        engine, _ = util.invoke_if_callable(self._engine)
        with as_polygraphy_error(self.name):
            opened = engine if isinstance(engine, EngineFile) else EngineFile.open(Path(engine))
            self.session = EngineSession(opened, name=self.name).__enter__()

    @util.check_called_by("get_input_metadata")
    def get_input_metadata_impl(self) -> TensorMetadata:
        return self.session.runner.get_input_metadata(use_numpy_dtypes=False)

    @util.check_called_by("infer")
    def infer_impl(self, feed_dict: Mapping[str, np.ndarray]) -> OrderedDict:
        with as_polygraphy_error(self.name):
            outputs = self.session.infer(feed_dict)
        self.inference_time = self.session.last_inference_time()
        return OrderedDict(outputs)

    @util.check_called_by("deactivate")
    def deactivate_impl(self) -> None:
        self.session.__exit__(None, None, None)
        del self.session
