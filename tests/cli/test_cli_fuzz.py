"""CLI fuzz test: random graphs, mutated protobufs and random bytes through every command, in-process.

Whatever the file, every command must end with an exit status of 0-3, never a traceback nor trtfuse's last-resort
"internal error" line; with -q at most one line on stderr; and no file left behind beyond the outputs a successful
call names (none at all after a failure), the input folder untouched. TRTFUSE_FUZZ_CASES sets the number of cases
(default 150, a few seconds; the full run of issue 10 is TRTFUSE_FUZZ_CASES=10000) and TRTFUSE_FUZZ_SEED the seed.
"""

from __future__ import annotations

import contextlib
import math
import os
import random
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import onnx
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper

from trtfuse.cli.main import cli
from trtfuse.cli.options import EXIT_MISSING_DEPENDENCY

from support.models import layer_norm_model, llama_norm_model, projection_model, save_external

CASES = int(os.environ.get("TRTFUSE_FUZZ_CASES", "150"))
SEED = int(os.environ.get("TRTFUSE_FUZZ_SEED", "0"))
OP_TYPES = (
    "Pow",
    "ReduceMean",
    "Add",
    "Sqrt",
    "Div",
    "Mul",
    "Cast",
    "Reciprocal",
    "RMSNormalization",
    "SimplifiedLayerNormalization",
    "SkipSimplifiedLayerNormalization",
    "TrtfuseRmsNorm",
    "TrtfuseQkNorm",
    "Constant",
    "Identity",
    "If",
    "Loop",
    "NoSuchOp",
    "",
)
DOMAINS = ("", "ai.onnx", "com.microsoft", "trtfuse", "local.functions", "\x00\x1b")
ODD_NAMES = ("", "x", "\x1b[31mred\x1b[0m", "line\nbreak", "tab\there", "\x00nul", "é" * 3, "a" * 300)
ODD_FLOATS = (math.nan, math.inf, -math.inf, -1.0, 0.0, 1e-30, 1e30, 2.0, 0.5)
ODD_INTS = (-(1 << 62), -1, 0, 1, 2, 3, 7, 1 << 40)
# A user's export, put where an output goes: no call may replace it.
EXPORT = llama_norm_model().SerializeToString()


def _external_seed() -> tuple[onnx.ModelProto, bytes]:
    """The projection model with its weights in `weights.data` (the large one stays there when loaded), and that
    file's bytes: the fuzz writes them beside every case, so fuse and compile copy external data to their folder."""
    with tempfile.TemporaryDirectory() as folder:
        path = save_external(projection_model(), Path(folder) / "model.onnx")
        return onnx.load(str(path), load_external_data=False), (Path(folder) / "weights.data").read_bytes()


EXTERNAL_SEED, EXTERNAL_DATA = _external_seed()


def _seeds() -> list[onnx.ModelProto]:
    return [
        llama_norm_model(layers=2),
        llama_norm_model(dtype=TensorProto.FLOAT, hidden=16, opset=13),
        llama_norm_model(dtype=TensorProto.BFLOAT16, hidden=8),
        layer_norm_model(),
        projection_model(),
        # Three times: the copy of external data into the output folder is where data can be lost.
        EXTERNAL_SEED,
        EXTERNAL_SEED,
        EXTERNAL_SEED,
    ]


def _mutate_node(rng: random.Random, model: onnx.ModelProto) -> None:
    nodes = model.graph.node
    if not nodes:
        return
    node = rng.choice(nodes)
    names = [name for other in nodes for name in (*other.input, *other.output)]
    choice = rng.randrange(9)
    if choice == 0:
        node.op_type = rng.choice(OP_TYPES)
    elif choice == 1:
        node.domain = rng.choice(DOMAINS)
    elif choice == 2 and node.input:
        node.input[rng.randrange(len(node.input))] = rng.choice([*names, *ODD_NAMES])
    elif choice == 3 and node.output:
        node.output[rng.randrange(len(node.output))] = rng.choice([*names, *ODD_NAMES])
    elif choice == 4:
        node.name = rng.choice(ODD_NAMES)
    elif choice == 5 and node.attribute:
        attribute = rng.choice(node.attribute)
        attribute.f, attribute.i = rng.choice(ODD_FLOATS), rng.choice(ODD_INTS)
    elif choice == 6:
        node.attribute.append(
            helper.make_attribute(rng.choice(("epsilon", "axis", "to", "keepdims")), rng.choice(ODD_INTS))
        )
    elif choice == 7:
        nodes.remove(node)
    else:
        index = rng.randrange(len(nodes))
        moved = nodes.pop(index)
        nodes.insert(rng.randrange(len(nodes) + 1), moved)


def _mutate_tensor(rng: random.Random, model: onnx.ModelProto) -> None:
    tensors = model.graph.initializer
    if not tensors:
        return
    tensor = rng.choice(tensors)
    choice = rng.randrange(6)
    if choice == 0:
        tensor.dims.append(rng.choice((0, 1, 2, 64)))
    elif choice == 1:
        tensor.data_type = rng.choice((0, 1, 7, 10, 16, 22, 99))
    elif choice == 2:
        tensor.raw_data = tensor.raw_data[: rng.randrange(len(tensor.raw_data) + 1)]
    elif choice == 3:
        tensor.data_location = TensorProto.EXTERNAL
        del tensor.external_data[:]
        for key, value in (
            ("location", rng.choice(("w.data", "../w.data", "/etc/passwd", "a\x00b", ""))),
            ("offset", rng.choice(("0", "-4", "x", "99999999999"))),
            ("length", rng.choice(("4", "-1", "", "1e3"))),
        ):
            if rng.random() < 0.8:
                tensor.external_data.append(onnx.StringStringEntryProto(key=key, value=value))
    elif choice == 4:
        model.graph.input.append(helper.make_tensor_value_info(tensor.name, tensor.data_type, list(tensor.dims)))
    else:
        tensor.name = rng.choice(ODD_NAMES)


def _mutate_model(rng: random.Random, model: onnx.ModelProto) -> None:
    choice = rng.randrange(5)
    if choice == 0:
        model.opset_import[0].version = rng.choice((1, 9, 13, 17, 18, 21, 23, 24, 1000))
    elif choice == 1:
        model.ir_version = rng.choice((0, 1, 3, 4, 7, 10, 11, 99))
    elif choice == 2 and model.graph.input:
        dims = model.graph.input[0].type.tensor_type.shape.dim
        if dims:
            dim = rng.choice(dims)
            if rng.random() < 0.5:
                dim.dim_value = rng.choice(ODD_INTS)
            else:
                dim.dim_param = rng.choice(("seq // 0", "seq - 10", "batch", "", "1e9"))
    elif choice == 3:
        model.graph.input[0].type.tensor_type.elem_type = rng.choice((1, 6, 7, 8, 10, 16))
    else:
        model.graph.output[0].name = rng.choice([*ODD_NAMES, model.graph.input[0].name])


def random_graph(rng: random.Random) -> bytes:
    """A seed model with a few structural mutations: mostly still a parseable ONNX model."""
    model = onnx.ModelProto()
    model.CopyFrom(rng.choice(SEEDS))
    for _ in range(rng.randint(1, 3)):
        rng.choice((_mutate_node, _mutate_tensor, _mutate_model))(rng, model)
    return model.SerializeToString()


def mutated_bytes(rng: random.Random) -> bytes:
    """A serialised seed with a few bytes flipped, inserted, deleted, or the file cut short."""
    data = bytearray(rng.choice(SEEDS).SerializeToString())
    for _ in range(rng.randint(1, 4)):
        position = rng.randrange(len(data))
        choice = rng.randrange(4)
        if choice == 0:
            data[position] = rng.randrange(256)
        elif choice == 1:
            data.insert(position, rng.randrange(256))
        elif choice == 2:
            del data[position : position + rng.randint(1, 8)]
        else:
            del data[position:]
            break
    return bytes(data)


def random_bytes(rng: random.Random) -> bytes:
    return rng.randbytes(rng.choice((0, 1, 7, 64, 1000)))


SEEDS = _seeds()
GENERATORS: tuple[Callable[[random.Random], bytes], ...] = (random_graph, random_graph, mutated_bytes, random_bytes)


def _commands(model: Path, out: Path) -> dict[str, tuple[list[str], set[str]]]:
    """Each command's arguments and the files a successful call may leave in `out`."""
    return {
        "inspect": (["inspect", str(model)], set()),
        "inspect --json": (["inspect", str(model), "--json"], set()),
        "fuse": (  # may copy weights.data beside its output
            ["fuse", str(model), "-o", str(out / "f.onnx"), "--report", str(out / "r.json")],
            {"f.onnx", "r.json", "weights.data"},
        ),
        "check": (["check", str(model), str(model), "--dim", "batch=1", "--dim", "sequence=2"], set()),
        "compile": (
            ["compile", str(model), "-o", str(out / "m.engine")],
            {"m.fused.onnx", "m.fusion.json", "weights.data"},
        ),
        "run": (["run", str(model)], set()),
        "compare": (["compare", str(model), str(model), "--report", str(out / "c.json")], {"c.json"}),
    }


def _listing(folder: Path) -> set[str]:
    return {str(path.relative_to(folder)) for path in folder.rglob("*")}


def test_no_traceback_and_no_stray_file(tmp_path: Path) -> None:
    rng = random.Random(SEED)
    inputs, out = tmp_path / "in", tmp_path / "out"
    inputs.mkdir()
    out.mkdir()
    model = inputs / "model.onnx"
    (inputs / "weights.data").write_bytes(EXTERNAL_DATA)
    data_stat = (inputs / "weights.data").stat()
    runner = CliRunner()
    for case in range(CASES):
        data = rng.choice(GENERATORS)(rng)
        model.write_bytes(data)
        before = _listing(inputs)
        name, (args, allowed) = rng.choice(list(_commands(model, out).items()))
        quiet = rng.random() < 0.5
        # Another model's data file of the same name in the output folder must never be overwritten.
        unrelated = name in ("fuse", "compile") and rng.random() < 0.5
        if unrelated:
            (out / "weights.data").write_bytes(b"another model's weights")
        # Nor a file of the user's where an output goes (a model of theirs, or any other file): no --force is given.
        users = rng.choice(sorted(allowed - {"weights.data"})) if allowed and rng.random() < 0.3 else None
        if users is not None:
            (out / users).write_bytes(EXPORT if rng.random() < 0.5 else b"the user's own file")
            users_bytes = (out / users).read_bytes()
        result = runner.invoke(cli, [*args, "-q"] if quiet else args)
        where = f"case {case} (TRTFUSE_FUZZ_SEED={SEED}): trtfuse {name} on {len(data)} bytes"
        text = result.stdout + result.stderr
        assert result.exception is None or isinstance(result.exception, SystemExit), f"{where}: {result.exception!r}"
        assert result.exit_code in (0, 1, 2, EXIT_MISSING_DEPENDENCY), f"{where}: exit {result.exit_code}: {text}"
        assert "Traceback" not in text and "internal error" not in text, f"{where}: {text}"
        if quiet:
            assert len(result.stderr.splitlines()) <= 1, f"{where}: {result.stderr}"
        left = _listing(out) - ({"weights.data"} if unrelated else set()) - ({users} if users else set())
        assert left <= (allowed if result.exit_code in (0, 1, EXIT_MISSING_DEPENDENCY) else set()), f"{where}: {left}"
        if unrelated:
            assert (out / "weights.data").read_bytes() == b"another model's weights", f"{where}: clobbered"
        if users is not None:
            assert (out / users).read_bytes() == users_bytes, f"{where}: the user's {users} clobbered"
        assert _listing(inputs) == before, f"{where}: the input folder changed"
        new_stat = (inputs / "weights.data").stat()
        assert (new_stat.st_ino, new_stat.st_mtime_ns) == (data_stat.st_ino, data_stat.st_mtime_ns), where
        shutil.rmtree(out)
        out.mkdir()


@pytest.mark.parametrize("generator", GENERATORS[1:], ids=lambda generator: generator.__name__)
def test_generators_make_what_they_say(generator: Callable[[random.Random], bytes]) -> None:
    # The fuzz is only as good as its inputs: random graphs must mostly parse, random bytes mostly not.
    rng = random.Random(1)
    parsed = 0
    for _ in range(50):
        # Any parse failure counts as "not parsed".
        with contextlib.suppress(Exception):
            parsed += onnx.load_from_string(generator(rng)).HasField("graph")
    assert parsed >= 40 if generator is random_graph else parsed <= 45
