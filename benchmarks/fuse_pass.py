"""Benchmark of the fusion pass on a Llama-2-7B-shaped graph: 32 layers, hidden 4096, fp16, external weights.

Writes the model and a sparse external data file (about 13 GB apparent, almost nothing on disk) to a temp folder,
then times `trtfuse fuse` on it in a subprocess and reports wall time and the subprocess's peak RSS. Only the norm
weights (8 KiB each) hold real random data; the large weights are holes in the sparse file, which the pass must never
read. Run: python3 benchmarks/fuse_pass.py [--layers 32] [--hidden 4096] [--keep FOLDER]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

REPO = Path(__file__).resolve().parent.parent
HEAD_DIM = 128
VOCAB = 32000
DATA_FILE = "weights.data"
FP16 = TensorProto.FLOAT16


class ExternalWeights:
    """Lays tensors out in one data file; large ones are left as holes, small ones get real bytes."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.small: list[tuple[int, bytes]] = []
        self.tensors: list[onnx.TensorProto] = []

    def add(self, name: str, dims: tuple[int, ...], payload: bytes | None = None) -> str:
        length = int(np.prod(dims)) * 2
        tensor = onnx.TensorProto(name=name, data_type=FP16, dims=dims)
        tensor.data_location = TensorProto.EXTERNAL
        for key, value in (("location", DATA_FILE), ("offset", str(self.offset)), ("length", str(length))):
            tensor.external_data.add(key=key, value=value)
        if payload is not None:
            self.small.append((self.offset, payload))
        self.tensors.append(tensor)
        # 4 KiB alignment, as onnx's own external-data writer can do, keeps the holes page-aligned.
        self.offset += (length + 4095) // 4096 * 4096
        return name

    def write(self) -> None:
        with self.path.open("wb") as file:
            file.truncate(self.offset)
            for offset, payload in self.small:
                file.seek(offset)
                file.write(payload)


class LlamaGraph:
    """The node list of a Llama decoder as HF's TorchScript export spells it (no RoPE, no KV cache)."""

    def __init__(self, layers: int, hidden: int, weights: ExternalWeights) -> None:
        self.layers, self.hidden, self.weights = layers, hidden, weights
        self.rng = np.random.default_rng(0)
        self.nodes: list[onnx.NodeProto] = []
        self.inline = [
            numpy_helper.from_array(np.array(2.0, np.float32), "two"),
            numpy_helper.from_array(np.array(1.0, np.float32), "one"),
            numpy_helper.from_array(np.array(1e-6, np.float32), "epsilon"),
            numpy_helper.from_array(np.array([-1], np.int64), "last_axis"),
            numpy_helper.from_array(np.array([0, 0, hidden // HEAD_DIM, HEAD_DIM], np.int64), "heads_shape"),
            numpy_helper.from_array(np.array([0, 0, hidden], np.int64), "hidden_shape"),
            numpy_helper.from_array(np.array(HEAD_DIM**-0.5, np.float16), "attention_scale"),
        ]

    def node(self, op: str, inputs: list[str], name: str, **attrs: object) -> str:
        self.nodes.append(helper.make_node(op, inputs, [name], name=name, **attrs))
        return name

    def rms_norm(self, x: str, prefix: str) -> str:
        weight = self.rng.normal(1.0, 0.1, self.hidden).astype(np.float16).tobytes()
        w = self.weights.add(f"{prefix}.weight", (self.hidden,), weight)
        x32 = self.node("Cast", [x], f"{prefix}/Cast", to=TensorProto.FLOAT)
        square = self.node("Pow", [x32, "two"], f"{prefix}/Pow")
        mean = self.node("ReduceMean", [square, "last_axis"], f"{prefix}/ReduceMean", keepdims=1)
        variance = self.node("Add", [mean, "epsilon"], f"{prefix}/Add")
        root = self.node("Sqrt", [variance], f"{prefix}/Sqrt")
        inverse_root = self.node("Div", ["one", root], f"{prefix}/Div")
        normalised = self.node("Mul", [x32, inverse_root], f"{prefix}/Mul")
        cast_back = self.node("Cast", [normalised], f"{prefix}/Cast_1", to=FP16)
        return self.node("Mul", [w, cast_back], f"{prefix}/Mul_1")

    def linear(self, x: str, name: str, width_in: int, width_out: int) -> str:
        return self.node("MatMul", [x, self.weights.add(f"{name}.weight", (width_in, width_out))], f"{name}/MatMul")

    def attention(self, x: str, prefix: str) -> str:
        heads = {}
        for part in ("q", "k", "v"):
            projected = self.linear(x, f"{prefix}.{part}_proj", self.hidden, self.hidden)
            split = self.node("Reshape", [projected, "heads_shape"], f"{prefix}/{part}/Reshape")
            heads[part] = self.node("Transpose", [split], f"{prefix}/{part}/Transpose", perm=[0, 2, 1, 3])
        keys = self.node("Transpose", [heads["k"]], f"{prefix}/k/Transpose_1", perm=[0, 1, 3, 2])
        scores = self.node("MatMul", [heads["q"], keys], f"{prefix}/scores")
        scaled = self.node("Mul", [scores, "attention_scale"], f"{prefix}/scale")
        probabilities = self.node("Softmax", [scaled], f"{prefix}/Softmax", axis=-1)
        context = self.node("MatMul", [probabilities, heads["v"]], f"{prefix}/context")
        merged = self.node("Transpose", [context], f"{prefix}/context/Transpose", perm=[0, 2, 1, 3])
        flat = self.node("Reshape", [merged, "hidden_shape"], f"{prefix}/context/Reshape")
        return self.linear(flat, f"{prefix}.o_proj", self.hidden, self.hidden)

    def mlp(self, x: str, prefix: str) -> str:
        intermediate = self.hidden * 11008 // 4096
        gate = self.linear(x, f"{prefix}.gate_proj", self.hidden, intermediate)
        up = self.linear(x, f"{prefix}.up_proj", self.hidden, intermediate)
        silu = self.node("Mul", [gate, self.node("Sigmoid", [gate], f"{prefix}/Sigmoid")], f"{prefix}/silu")
        return self.linear(
            self.node("Mul", [silu, up], f"{prefix}/gated"), f"{prefix}.down_proj", intermediate, self.hidden
        )

    def model(self) -> onnx.ModelProto:
        embed = self.weights.add("embed_tokens.weight", (VOCAB, self.hidden))
        hidden = self.node("Gather", [embed, "input_ids"], "embed_tokens/Gather")
        for layer in range(self.layers):
            prefix = f"layers.{layer}"
            attention = self.attention(self.rms_norm(hidden, f"{prefix}.input_layernorm"), f"{prefix}.self_attn")
            hidden = self.node("Add", [hidden, attention], f"{prefix}/attention_residual")
            mlp = self.mlp(self.rms_norm(hidden, f"{prefix}.post_attention_layernorm"), f"{prefix}.mlp")
            hidden = self.node("Add", [hidden, mlp], f"{prefix}/mlp_residual")
        logits = self.linear(self.rms_norm(hidden, "norm"), "lm_head", self.hidden, VOCAB)
        self.nodes.append(helper.make_node("Identity", [logits], ["logits"], name="logits"))
        graph = helper.make_graph(
            self.nodes,
            "llama",
            [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "sequence"])],
            [helper.make_tensor_value_info("logits", FP16, ["batch", "sequence", VOCAB])],
            [*self.inline, *self.weights.tensors],
        )
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def build(folder: Path, layers: int, hidden: int) -> Path:
    weights = ExternalWeights(folder / DATA_FILE)
    model = LlamaGraph(layers, hidden, weights).model()
    weights.write()
    path = folder / "llama.onnx"
    onnx.save_model(model, str(path))
    return path


def run_fuse(model: Path, output: Path, report: Path) -> tuple[float, int, str]:
    """Wall seconds and peak RSS (bytes) of one `trtfuse fuse` subprocess, and what it printed."""
    command = [sys.executable, "-m", "trtfuse.cli.main", "fuse", str(model), "-o", str(output), "--report", str(report)]
    start = time.perf_counter()
    process = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    printed = process.stdout.read()
    _, status, usage = os.wait4(process.pid, 0)
    elapsed = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"trtfuse fuse failed:\n{printed}")
    # ru_maxrss is in KiB on Linux.
    return elapsed, usage.ru_maxrss * 1024, printed.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--keep", type=Path, help="Build in this folder and keep it, instead of a temp folder.")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="trtfuse-bench-") as temp:
        folder = args.keep or Path(temp)
        folder.mkdir(parents=True, exist_ok=True)
        start = time.perf_counter()
        model = build(folder, args.layers, args.hidden)
        data = folder / DATA_FILE
        print(
            f"built {model} in {time.perf_counter() - start:.1f} s: {model.stat().st_size / 1e6:.2f} MB graph, "
            f"{data.stat().st_size / 1e9:.2f} GB external data ({data.stat().st_blocks * 512 / 1e6:.1f} MB on disk)"
        )
        runs = [run_fuse(model, folder / "llama.fused.onnx", folder / "report.json") for _ in range(args.repeats)]
        print(runs[-1][2])
        report = json.loads((folder / "report.json").read_text())
        fused = onnx.load(str(folder / "llama.fused.onnx"), load_external_data=False)
        external = sum(tensor.data_location == TensorProto.EXTERNAL for tensor in fused.graph.initializer)
        print(f"report totals: {report['totals']}; fused model keeps {external} tensors in {DATA_FILE}")
        for index, (elapsed, peak, _) in enumerate(runs, 1):
            print(f"run {index}: wall {elapsed:.2f} s, peak RSS {peak / 2**20:.0f} MiB")
        print(f"best: wall {min(run[0] for run in runs):.2f} s, peak RSS {max(run[1] for run in runs) / 2**20:.0f} MiB")


if __name__ == "__main__":
    main()
