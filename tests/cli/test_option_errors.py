"""OptionError: the core names a user choice in model terms; the CLI, in one place, spells it as its flag."""

import onnx
import pytest
from click.testing import CliRunner

from trtfuse.cli.main import cli
from trtfuse.errors import Choice, OptionError

from support.kv_models import optimum_model


def test_option_error_names_choices_in_model_terms_until_an_interface_spells_them():
    error = OptionError("shape", Choice("shape"), " ids fixes dim 'seq', which ", Choice("tokens"), " also sets")
    assert error.choice == "shape"
    assert str(error) == "shape ids fixes dim 'seq', which tokens also sets"
    assert error.spelled(lambda name: f"--{name}") == "--shape ids fixes dim 'seq', which --tokens also sets"


def test_the_cli_spells_every_choice_of_a_message_as_its_flag(tmp_path):
    model_path = tmp_path / "m.onnx"
    model = optimum_model()
    model.opset_import[0].version = 17
    onnx.save(model, model_path)
    result = CliRunner().invoke(
        cli, ["compile", str(model_path), "--past", "0:1:8", "--shape", "attention_mask=1x1:1x4:1x8"]
    )
    assert result.exit_code == 2
    assert "trtfuse: error: --shape attention_mask fixes dim" in result.output
    assert "which --past also sets; give one or the other" in result.output
    assert sorted(path.name for path in tmp_path.iterdir()) == ["m.onnx"]


def test_bench_kernels_runs_one_section_and_names_the_choices_of_a_wrong_one(monkeypatch):
    """`--section` reaches the benchmark's run (here a stand-in: no GPU in CI) as the sections to run; a section the
    benchmark does not have is refused with exit 2, naming every one it has."""
    runner = CliRunner()
    wrong = runner.invoke(cli, ["bench", "kernels", "--section", "nope"])
    assert wrong.exit_code == 2 and "'anchors'" in wrong.output and "'rope'" in wrong.output
    torch = pytest.importorskip("torch")
    bench = pytest.importorskip("trtfuse.bench.kernels")
    seen = {}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(bench, "run", lambda compiled, sections: seen.update(sections=sections) or {})
    monkeypatch.setattr(bench, "print_report", lambda report: None)
    result = runner.invoke(cli, ["bench", "kernels", "--section", "anchors", "--section", "rope"])
    assert result.exit_code == 0, result.output
    assert seen == {"sections": ("anchors", "rope")}
