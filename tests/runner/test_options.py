"""Overrides as command-line options: nested groups become dotted options, values the parser's spelling."""

from __future__ import annotations

from pathlib import Path

import pytest

from pfl.api.overrides import to_argv
from pfl.errors import ConfigError


def test_overrides_are_the_command_lines_arguments():
    assert to_argv(None, {"trainer": {"rounds": 20, "fraction": 0.5}}) == to_argv(
        None, {"trainer.rounds": 20, "trainer.fraction": 0.5}
    )
    argv = to_argv(
        ["a.yaml", Path("b.yaml")],
        {"method": {"name": "ditto", "lam": 1e-5}, "model": {"hidden": [8, 8], "init_args": {"w": 2}}, "seed": 1},
    )
    assert argv == [
        "--config", "a.yaml", "--config", "b.yaml", "--method.name", "ditto", "--method.lam", "1e-05",
        "--model.hidden", "[8, 8]", "--model.init_args", '{"w": 2}', "--seed", "1",
    ]  # fmt: skip
    assert to_argv("a.yaml", {"method": "ditto"}) == ["--config", "a.yaml", "--method", "ditto"]
    texts = [to_argv(None, {"k": v})[1] for v in (True, False, None, float("inf"), -float("inf"), float("nan"))]
    assert texts == ["true", "false", "null", ".inf", "-.inf", ".nan"]
    assert to_argv(None, {"tracking.root": Path("x/y")}) == ["--tracking.root", "x/y"]
    with pytest.raises(ConfigError, match="not an option name"):
        to_argv(None, {"trainer": {1: 2}})
    with pytest.raises(ConfigError, match=r"model.hidden: \[nan\] is no config value"):
        to_argv(None, {"model": {"hidden": [float("nan")]}})  # YAML has no JSON NaN: refused, not mistyped
