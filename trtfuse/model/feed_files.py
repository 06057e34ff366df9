"""Arrays in .npz files, the one reader and writer: plain arrays by name (`run --inputs`, `run --save-outputs`), and
the inputs of a check or comparison as one .npz, so that a run can be repeated exactly (`--save-inputs`,
`--load-inputs`).

Each step's arrays are stored as `STEP/INPUT`, and `STEPS_KEY` lists the steps in order (input names may hold '/'
themselves, step names do not). An .npz without `STEPS_KEY`, such as one written by `numpy.savez(**feed)`, is one
step named `LOADED` holding one array per input. Every .npz written here carries `ARCHIVE_COMMENT` as its zip
comment (which numpy does not read), so that a later call knows it may replace the file (`is_trtfuse_archive`).
"""

from __future__ import annotations

import io
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import onnx
from onnx import helper

from trtfuse.errors import TrtfuseError
from trtfuse.files import check_readable, write_bytes_atomic
from trtfuse.model.feeds import StepFeed
from trtfuse.model.interface import fed_inputs

STEPS_KEY = "__trtfuse_steps__"
LOADED = "loaded"
ARCHIVE_COMMENT = b"written by trtfuse"


def write_arrays(path: Path, arrays: Mapping[str, np.ndarray]) -> None:
    """Arrays by name as one .npz at `path`, written atomically, with trtfuse's zip comment."""
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    with zipfile.ZipFile(buffer, "a") as archive:
        archive.comment = ARCHIVE_COMMENT
    write_bytes_atomic(path, buffer.getbuffer())


def is_trtfuse_archive(path: Path) -> bool:
    """Whether the file at `path` is an .npz trtfuse wrote: its zip comment, or the step list of saved inputs (an
    .npz written before the comment existed)."""
    try:
        with zipfile.ZipFile(path) as archive:
            return archive.comment == ARCHIVE_COMMENT or f"{STEPS_KEY}.npy" in archive.namelist()
    except (OSError, zipfile.BadZipFile):
        return False


def read_arrays(path: Path) -> dict[str, np.ndarray]:
    """Every array of the .npz at `path`, by name."""
    check_readable(path)
    try:
        with np.load(path, allow_pickle=False) as archive:
            return {name: archive[name] for name in archive.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as error:
        raise TrtfuseError(f"{path}: not a readable .npz of input arrays ({error})") from None


def save_feeds(path: Path, feeds: Sequence[StepFeed]) -> None:
    """Every step's feed in one .npz at `path`, written atomically."""
    arrays = {STEPS_KEY: np.array([feed.step for feed in feeds])}
    for feed in feeds:
        arrays.update({f"{feed.step}/{name}": array for name, array in feed.feed.items()})
    write_arrays(path, arrays)


def load_feeds(path: Path, model: onnx.ModelProto) -> list[StepFeed]:
    """The steps saved in `path`, each checked against `model`'s graph inputs: every input present, no other array,
    each of the input's dtype and rank."""
    arrays = read_arrays(path)
    if STEPS_KEY not in arrays:
        feeds = [StepFeed(step=LOADED, dims={}, feed=arrays)]
    else:
        steps = [str(step) for step in arrays.pop(STEPS_KEY).ravel()]
        if not steps:
            raise TrtfuseError(f"{path}: holds no steps to run (its {STEPS_KEY} list is empty)")
        feeds = [
            StepFeed(
                step=step,
                dims={},
                feed={
                    key.removeprefix(f"{step}/"): array for key, array in arrays.items() if key.startswith(f"{step}/")
                },
            )
            for step in steps
        ]
        stray = sorted(key for key in arrays if not any(key.startswith(f"{step}/") for step in steps))
        if stray:
            raise TrtfuseError(f"{path}: array '{stray[0]}' belongs to none of the steps {', '.join(steps)}")
    return [_checked_feed(path, feed, model) for feed in feeds]


def _checked_feed(path: Path, feed: StepFeed, model: onnx.ModelProto) -> StepFeed:
    inputs = {value.name: value for value in fed_inputs(model)}
    where = f"{path}: step '{feed.step}'" if feed.step != LOADED else str(path)
    missing = sorted(set(inputs) - set(feed.feed))
    if missing:
        raise TrtfuseError(f"{where} has no array for input '{missing[0]}'")
    extra = sorted(set(feed.feed) - set(inputs))
    if extra:
        raise TrtfuseError(f"{where}: array '{extra[0]}' is no graph input of the model")
    checked = {}
    for name, value in inputs.items():
        array = feed.feed[name]
        tensor = value.type.tensor_type
        expected = np.dtype(helper.tensor_dtype_to_np_dtype(tensor.elem_type)) if tensor.elem_type else array.dtype
        if array.dtype.kind == "V" and array.dtype.itemsize == expected.itemsize and expected.name == "bfloat16":
            # numpy stores ml_dtypes' bfloat16 as raw 2-byte records.
            array = array.view(expected)
        if array.dtype != expected:
            raise TrtfuseError(f"{where}: input '{name}' is {array.dtype.name}, the model takes {expected.name}")
        if tensor.HasField("shape") and array.ndim != len(tensor.shape.dim):
            raise TrtfuseError(
                f"{where}: input '{name}' has rank {array.ndim}, the model takes {len(tensor.shape.dim)}"
            )
        checked[name] = array
    return StepFeed(step=feed.step, dims=feed.dims, feed=checked)
