"""Tests of pfl/methods/choices.py: choice-valued hyper-parameters (``Literal``) refused with one check,
in Python as on the command line, for every built-in method."""

from __future__ import annotations

from typing import Any, Literal, get_args

import pytest
from jsonargparse import ArgumentError, ArgumentParser

from pfl.errors import ConfigError
from pfl.methods import Method, fedmgda, fedora, fedpg, method_class, pfedhn, rl_tuning
from pfl.methods.choices import choices
from pfl.optim import capped_simplex, ddpg, descent, hypernet, minnorm, propagation
from tests.methods.helpers import REGISTERED as NAMES


class Picky(Method):
    """A method with choice-valued options: one plain, one optional, one inherited by a variant."""

    name = "_picky_for_test"

    def __init__(self, mode: Literal["a", "b"] = "a", lag: Literal[0, 1] | None = None, other: str = "x"):
        self.mode, self.lag, self.other = mode, lag, other


class PickyVariant(Picky):
    def __init__(self, extra: Literal["p", "q"] = "p", **kwargs: Any):
        super().__init__(**kwargs)
        self.extra = extra


def test_one_generic_check_refuses_values_outside_a_literal_before_init_runs():
    assert choices(PickyVariant) == {"mode": ("a", "b"), "lag": (0, 1, None), "extra": ("p", "q")}
    Picky("b", 1, "anything")
    Picky(lag=None)
    PickyVariant("q", mode="b", lag=0)
    for make, field, got, allowed in (
        (lambda: Picky("c"), "mode", "'c'", "a, b"),  # positional
        (lambda: Picky(lag=2), "lag", "2", "0, 1, None"),
        (lambda: PickyVariant(mode="z"), "mode", "'z'", "a, b"),  # the parent's option, passed on
        (lambda: PickyVariant("r"), "extra", "'r'", "p, q"),
    ):
        with pytest.raises(ConfigError) as err:
            make()
        assert str(err.value) == f"method.{field}: unknown value {got} (choose one of {allowed})"
    with pytest.raises(TypeError):  # a call __init__ refuses keeps Python's own error
        Picky(nonsense=1)


class Stray(Picky):
    """A variant whose own default lies outside its parent's choices."""

    def __init__(self, mode: str = "z", **kwargs: Any):
        super().__init__(mode=mode, **kwargs)


def test_a_default_outside_the_parents_choices_is_refused_too():
    with pytest.raises(ConfigError, match=r"^method\.mode: unknown value 'z'"):
        Stray()
    assert Stray("b").mode == "b"


def test_the_command_line_refuses_the_same_values():
    parser = ArgumentParser(exit_on_error=False)
    parser.add_class_arguments(PickyVariant, "method")
    assert parser.parse_args(["--method.mode", "b"]).method.mode == "b"
    for argv in (["--method.mode", "c"], ["--method.extra", "r"], ["--method.lag", "2"]):
        with pytest.raises(ArgumentError):
            parser.parse_args(argv)


# Each built-in method's choice-valued options, pinned: an option whose annotation stopped being a
# Literal would drop out of choices(), and with it out of the command line's and the Python check.
CHOICE_OPTIONS = {
    "apfl": {"eval_mix"},
    "dapfl": {"action_map", "epoch_rounding", "init", "replay_actions", "reward_split", "warmup_space", "weighting"},
    "ditto": {"prox"},
    "feddyn": {"weighting"},
    "fedfomo": {"affinity", "distance"},
    "fedmgda_plus": {"center", "solver"},
    "fedora": {"lambda_rule", "propagation", "pull", "similarity"},
    "fedpg": {"rescale", "solver"},
    "fedrod": {"head_init"},
    "fedu": {"graph"},
    "page": {
        "action_map",
        "actions",
        "client_lag",
        "epoch_rounding",
        "init",
        "replay_actions",
        "reward_split",
        "server_lag",
        "warmup_space",
    },
    "perfedavg": {"variant", "weighting"},
    "pfedme": {"weighting"},
    "pgfed_ce": {"ce_scalar"},
    "plgu_ghn": {"sam_gradient"},
    "plgu_lf": {"ascent", "scale"},
    "scaffold": {"option", "weighting"},
    "sfedpg": {"rescale", "solver"},
}


@pytest.mark.parametrize("name", NAMES)
def test_every_builtin_choice_is_checked_with_the_one_line_error(name):
    cls = method_class(name)
    options = choices(cls)
    assert set(options) == CHOICE_OPTIONS.get(name, set())
    for field, allowed in options.items():
        with pytest.raises(ConfigError) as err:
            cls(**{field: "no-such-choice"})
        assert err.value.field == f"method.{field}" and all(str(v) in err.value.fix for v in allowed)


def test_choices_mirrored_from_pfl_optim_agree_with_it():
    assert get_args(fedpg.Solver) == minnorm.SOLVERS and get_args(fedpg.Rescale) == descent.RESCALES
    assert get_args(fedmgda.Solver) == capped_simplex.SOLVERS
    assert get_args(fedora.LambdaRule) == propagation.LAMBDA_RULES
    assert get_args(pfedhn.SamGradient) == hypernet.SAM_GRADIENTS
    assert get_args(rl_tuning.ActionMap) == ddpg.ACTION_MAPS and get_args(rl_tuning.Init) == ddpg.INIT_SCHEMES
