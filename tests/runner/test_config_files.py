"""``--config``: an existing path first, else a config shipped with pfl by name, from any folder."""

from __future__ import annotations

from pathlib import Path

import pytest

import pfl
from pfl.errors import ConfigError
from pfl.runner import config_files
from pfl.runner.args import parse_fit_args
from pfl.runner.config_files import conf_dir, resolve_config, shipped_configs

ROOT = Path(__file__).resolve().parents[2]


def test_the_checkouts_conf_is_the_shipped_folder():
    assert config_files.PACKAGE == ROOT / "pfl"
    assert conf_dir() == ROOT / "conf"
    assert {"default", "method/ditto", "data/digits_pat2"} <= set(shipped_configs())
    assert len(shipped_configs()) == len(list((ROOT / "conf").rglob("*.yaml")))


def test_an_installed_pfl_reads_its_own_conf_folder(tmp_path, monkeypatch):
    (tmp_path / "pfl" / "conf" / "method").mkdir(parents=True)
    (tmp_path / "pfl" / "conf" / "method" / "mine.yaml").write_text("method: ditto\n")
    monkeypatch.setattr(config_files, "PACKAGE", tmp_path / "pfl")
    assert conf_dir() == tmp_path / "pfl" / "conf" and shipped_configs() == ["method/mine"]
    assert resolve_config("method/mine") == (tmp_path / "pfl" / "conf" / "method" / "mine.yaml").resolve()


@pytest.mark.parametrize("name", ["method/ditto", "method/ditto.yaml", "conf/method/ditto.yaml", "./conf/method/ditto"])
def test_a_shipped_config_is_found_by_name_from_any_folder(tmp_path, monkeypatch, name):
    monkeypatch.chdir(tmp_path)
    assert resolve_config(name) == (ROOT / "conf" / "method" / "ditto.yaml").resolve()


def test_an_existing_path_wins_over_a_shipped_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "default").write_text("seed: 3\n")
    assert resolve_config("default") == Path("default")


def test_a_missing_config_names_the_closest_shipped_one_or_the_fix(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as err:
        resolve_config("method/dito")
    assert str(err.value) == "--config: file not found: method/dito (did you mean method/ditto?)"
    with pytest.raises(ConfigError, match="name of a config shipped with pfl such as default"):
        resolve_config("qqqq/zzzz")


def test_a_name_never_reaches_outside_the_shipped_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert (ROOT / "conf" / ".." / "pyproject.toml").is_file()
    with pytest.raises(ConfigError, match="file not found"):
        resolve_config("../pyproject.toml")


def test_fit_reads_shipped_configs_by_name_from_another_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg, *_ = parse_fit_args(["--config", "default", "--config=method/ditto", "--tracking.wandb", "false"])
    assert cfg.method.name == "ditto" and cfg.data.source == "digits" and cfg.trainer.rounds == 100


def test_the_python_api_fits_a_shipped_config_by_name_from_another_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run = pfl.fit(
        "default",
        trainer={"rounds": 1, "progress": False},
        data={"num_clients": 4},
        model={"hidden": [16]},
        tracking={"wandb": False, "root": str(tmp_path / "runs"), "name": "r"},
    )
    assert run.summary["rounds"] == 1 and run.summary["dataset"] == "digits"
    assert (tmp_path / "runs" / "r" / "summary.json").is_file()
