"""Bad input that used to end in a traceback (OmegaConf's 88-line interpolation errors, torch's
negative-dimension error, Lightning's missing-package error) or, for 0 widths, in a model that
cannot learn: each is one line on stderr naming the field and the fix, exit status 2, before any
data is built or run folder written."""

from __future__ import annotations

import pytest
import yaml
from lightning.fabric.plugins.precision.transformer_engine import _TRANSFORMER_ENGINE_AVAILABLE

from pfl.cli import main
from pfl.runner.args import default_config, parse_fit_args

QUIET = ["--tracking.wandb", "false", "--trainer.progress", "false", "--trainer.rounds", "1"]


def one_line_error(capsys, argv: list[str], tmp_path) -> str:
    code = main(["fit", *argv, *QUIET, "--tracking.root", str(tmp_path / "runs")])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1 and err.startswith("error: "), err
    assert not (tmp_path / "runs").exists()
    return err.strip()


@pytest.mark.parametrize(
    ("yaml_text", "field", "fix"),
    [
        ("tracking:\n  name: ${oc.env:PFL_TEST_UNSET_VARIABLE}\n", "tracking.name", "${oc.env:NAME,default}"),
        ("tracking:\n  name: ${trainer.nosuch}\n", "tracking.name", "refer to a key that exists"),
        ("tracking:\n  name: ${eval:1}\n", "tracking.name", "OmegaConf's own resolvers"),
        ("trainer:\n  rounds: ${trainer.rounds}\n", "trainer.rounds", "cannot refer to itself"),
        ("method:\n  name: ${oc.env:PFL_TEST_UNSET_VARIABLE}\n", "method", "${oc.env:NAME,default}"),
    ],
)
def test_unresolvable_interpolation_is_one_line_naming_the_key(tmp_path, capsys, monkeypatch, yaml_text, field, fix):
    monkeypatch.delenv("PFL_TEST_UNSET_VARIABLE", raising=False)
    path = tmp_path / "conf.yaml"
    path.write_text(yaml_text)
    err = one_line_error(capsys, ["--config", str(path)], tmp_path)
    assert err.startswith(f"error: {field}: cannot resolve its ${{...}} interpolation in a --config file: ")
    assert fix in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--model.hidden", "[-3]"], "model.hidden: every width must be >= 1 (got [-3]) (e.g. [128, 128])"),
        (["--model.hidden", "[16, 0]"], "model.hidden: every width must be >= 1 (got [16, 0]) (e.g. [128, 128])"),
        (
            ["--model.name", "cnn", "--model.channels", "[-1,4]"],
            "model.channels: every width must be >= 1 (got [-1, 4])",
        ),
        (["--model.name", "cnn", "--model.channels", "[0,4]"], "model.channels: every width must be >= 1 (got [0, 4])"),
        (["--model.name", "cnn", "--model.fc", "0"], "model.fc: must be >= 1 (got 0)"),
        (["--model.name", "cnn", "--model.kernel", "0"], "model.kernel: must be >= 1 (got 0)"),
        (["--model.name", "cnn", "--model.padding", "-1"], "model.padding: must be >= 0 (got -1)"),
    ],
)
def test_model_widths_below_one_are_refused_in_one_line(tmp_path, capsys, argv, message):
    assert one_line_error(capsys, argv, tmp_path).startswith(f"error: {message}")


@pytest.mark.skipif(bool(_TRANSFORMER_ENGINE_AVAILABLE), reason="transformer_engine is installed here")
@pytest.mark.parametrize("precision", ["transformer-engine", "transformer-engine-float16"])
def test_transformer_engine_without_the_package_is_one_line(tmp_path, capsys, precision):
    err = one_line_error(capsys, ["--trainer.precision", precision], tmp_path)
    assert err.startswith(f"error: trainer.precision: {precision} needs NVIDIA's transformer_engine package")
    assert "bf16-mixed" in err


@pytest.mark.parametrize("text", ["", "# every setting commented out\n", "{}\n"])
def test_a_config_file_without_settings_is_one_line_naming_it(tmp_path, capsys, text):
    """It used to be "error: arguments: Unexpected config:", naming neither the file nor the fix."""
    path = tmp_path / "empty.yaml"
    path.write_text(text)
    err = one_line_error(capsys, ["--config", str(path)], tmp_path)
    fix = "(add some, e.g. trainer: {rounds: 5})"
    assert err == f"error: --config: {path} holds no settings (it is empty or only comments) {fix}"


@pytest.mark.parametrize("text", ["just a sentence\n", " ".join(["words"] * 400) + "\n"])
def test_a_config_file_of_plain_text_is_one_line_that_does_not_repeat_it(tmp_path, capsys, text):
    """It used to be "error: arguments: Unexpected config: " followed by the whole file."""
    path = tmp_path / "notes.yaml"
    path.write_text(text)
    err = one_line_error(capsys, ["--config", str(path)], tmp_path)
    assert err == f"error: --config: {path} holds plain text, not a mapping of groups (e.g. trainer: {{rounds: 5}})"


def test_a_config_file_omegaconf_cannot_hold_is_one_line_naming_it(tmp_path, capsys):
    path = tmp_path / "set.yaml"
    path.write_text("trainer:\n  rounds: !!set {3}\n")  # YAML, but a set is no config value
    err = one_line_error(capsys, ["--config", str(path)], tmp_path)
    assert err == f"error: --config: {path} cannot be read as a config: Value 'set' is not a supported primitive type"


def test_a_resume_that_changes_the_method_says_so(tmp_path, capsys):
    """It used to say that ditto "does not accept option finetune_epochs", an option never given."""
    run = tmp_path / "runs" / "r"
    run.mkdir(parents=True)
    (run / "config.yaml").write_text(yaml.safe_dump(default_config("fedavg")))  # what a fedavg fit records
    before = {p.name: p.read_bytes() for p in run.iterdir()}
    capsys.readouterr()
    assert main(["fit", "--resume", str(run), "--method.name", "ditto", "--trainer.rounds", "2"]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"error: --resume: {run} was recorded with method fedavg; a resume may not change the method (got ditto) "
        "(resume without --method.name, or start a new run (another --tracking.name) to train ditto)\n"
    )
    assert {p.name: p.read_bytes() for p in run.iterdir()} == before
    cfg, *_ = parse_fit_args(["--resume", str(run), "--method.name", "fedavg", "--trainer.rounds", "2"])
    assert cfg.method.name == "fedavg"  # naming the recorded method is no change


def test_a_yaml_error_is_told_in_one_line_with_or_without_where_it_is():
    from pfl.errors import yaml_problem

    with pytest.raises(yaml.YAMLError) as marked:
        yaml.safe_load("a: [1\nb: 2\n")
    assert yaml_problem(marked.value) == " at line 2, column 2: expected ',' or ']', but got ':'"
    assert yaml_problem(yaml.YAMLError("first\nsecond")) == ": first"  # no mark: the message's first line
    assert yaml_problem(yaml.YAMLError()) == ": YAMLError"
