"""pfl.fit's arguments: bad input and a missing config file raise ConfigError before anything is written."""

from __future__ import annotations

import pytest

import pfl
from pfl.errors import ConfigError
from tests.api.helpers import CONFIG, tiny_fit


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"trainer": {"fraction": 1.5}}, "trainer.fraction"),
        ({"trainer.fraction": 0}, "trainer.fraction"),
        ({"trainer.nope": 1}, "unrecognized"),
        ({"trainer": {"rounds": "many"}}, "trainer.rounds"),
        ({"method": "fedfoo"}, "method.name"),
        ({"method": {"class_path": "collections.OrderedDict"}}, "method.class_path"),
        ({"print_config": True}, "print_config"),
        ({"help": True}, "help"),
        ({"seed": object()}, "seed"),
    ],
)
def test_bad_input_raises_config_error_before_anything_is_written(tmp_path, overrides, field):
    with pytest.raises(ConfigError) as err:  # raised, not a SystemExit
        tiny_fit(tmp_path, "r", **overrides)
    assert field in str(err.value) and "\n" not in str(err.value)
    assert not (tmp_path / "r").exists()


def test_a_missing_config_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="--config: file not found: nope.yaml"):
        pfl.fit("nope.yaml")
    with pytest.raises(ConfigError, match="config: expected a path"):
        pfl.fit([CONFIG, 3])
