"""How methods declare their hyper-parameters: the client-optimizer options once, variants stating only
the defaults they change, and what the command line sees of them."""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import fields
from typing import Any, Literal, get_args

import pytest
from jsonargparse import ArgumentError, ArgumentParser

from pfl.errors import ConfigError
from pfl.methods import ClientOptimizerMethod, Method, fedmgda, fedora, fedpg, method_class, methods, pfedhn, rl_tuning
from pfl.methods.choices import choices
from pfl.methods.dapfl import DapFL
from pfl.methods.page import PAGE
from pfl.methods.rl_tuning import DDPGParams, HparamRange
from pfl.optim import capped_simplex, ddpg, descent, hypernet, minnorm, propagation
from pfl.runner.args import build_fit_parser

NAMES = list(methods())


def method_options(cls: type) -> dict[str, Any]:
    """The ``method.*`` options jsonargparse builds for ``cls``: name → default."""
    parser = ArgumentParser(exit_on_error=False)
    parser.add_class_arguments(cls, "method")
    return {a.dest.removeprefix("method."): a.default for a in parser._actions if a.dest.startswith("method.")}


class Mine(ClientOptimizerMethod):
    """A user's method that lets configs set the client optimizer: it states only its own option."""

    name = "_mine_for_test"

    def __init__(self, mu: float = 0.1, **kwargs: Any):
        super().__init__(**kwargs)
        self.mu = mu


def test_the_client_optimizer_options_are_declared_and_checked_once():
    assert method_options(Mine) == {"mu": 0.1, "client_momentum": None, "keep_momentum": None}
    assert Mine(client_momentum=0.5, keep_momentum=True).hparams() == {
        "mu": 0.1,
        "client_momentum": 0.5,
        "keep_momentum": True,
    }
    for bad in (1.0, -0.1):
        with pytest.raises(ConfigError, match="method.client_momentum"):
            Mine(client_momentum=bad)


@pytest.mark.parametrize("name", NAMES)
def test_a_method_offering_the_client_optimizer_gets_it_from_the_one_declaration(name):
    cls = method_class(name)
    options = method_options(cls)
    offered = {"client_momentum", "keep_momentum"} & set(options)
    assert offered in (set(), {"client_momentum", "keep_momentum"})
    if offered:
        assert issubclass(cls, ClientOptimizerMethod) and options["client_momentum"] is None
        with pytest.raises(ConfigError, match="method.client_momentum"):
            cls(client_momentum=1.0)


@pytest.mark.parametrize("name", NAMES)
def test_print_config_round_trips_every_methods_defaults(name):
    parser = build_fit_parser(name)
    defaults = parser.get_defaults()
    again = parser.parse_string(parser.dump(defaults))
    assert again.method == defaults.method
    args = again.method.clone().as_dict()
    args.pop("name")
    hparams = method_class(name)(**args).hparams()  # what the parser defaults to is a valid method
    assert all(hparams[k] == v for k, v in args.items() if v is not None)


def test_page_and_dapfl_take_their_agents_options_from_the_one_ddpg_params():
    shared = {f.name: f.default for f in fields(DDPGParams)}
    dapfl_own = {"actor_lr": 1e-4, "critic_lr": 1e-3, "tau": 0.001, "eps_decay_steps": 0}  # the Dap-FL code's
    assert method_options(PAGE).items() >= shared.items()
    assert method_options(DapFL).items() >= (shared | dapfl_own).items()
    for cls, expected in ((PAGE, shared), (DapFL, shared | dapfl_own)):
        method = cls(warmup=3, lr_max=0.2)
        assert method.ddpg == DDPGParams(**{**expected, "warmup": 3, "lr_max": 0.2})
        assert method.hparams().items() >= {**expected, "warmup": 3, "lr_max": 0.2, "hidden": [40, 30]}.items()
        assert method.range == HparamRange(1e-3, 0.2, 20) and method.warmup == 3


def test_ddpg_params_errors_name_the_methods_own_fields():
    params = DDPGParams(ddpg_batch_size=0)
    with pytest.raises(ConfigError, match=r"^method\.ddpg_batch_size: must be >= 1"):
        params.agent(1, 2, noise=True)
    with pytest.raises(ConfigError, match=r"^method\.server_critic_lr: must be > 0"):
        DDPGParams().agent(3, 3, noise=False, actor_lr=1.0, critic_lr=0.0, prefix="server_")
    agent = DDPGParams(hidden=[8, 4], tau=0.5).agent(3, 2, noise=False, actor_lr=0.25)
    assert (agent.state_dim, agent.action_dim, agent.hidden, agent.noise) == (3, 2, (8, 4), False)
    assert (agent.actor_lr, agent.critic_lr, agent.tau, agent.batch_size) == (0.25, 5e-3, 0.5, 32)
    for cls in (PAGE, DapFL):
        with pytest.raises(ConfigError, match="method.ddpg_batch_size"):
            cls(ddpg_batch_size=0)
        with pytest.raises(ConfigError, match="method.epoch_max"):
            cls(epoch_max=0)


# variant: (its parent, the defaults it changes, the options it adds)
VARIANTS = {
    "pgfedmo": ("pgfed", {"beta": 0.5}, {}),
    "pgfed_ce": ("pgfed", {}, {"ce_scalar": "per_client"}),
    "sfedpg": ("fedpg", {}, {"s": 1, "beta": 1e-4, "sigma": 1.0}),
    "fedprox": ("fedavg", {}, {"mu": 0.01}),
    "fedrep": ("fedper", {}, {"head_epochs": 1, "adapt_body": False}),
    "plgu_ghn": ("pfedhn", {}, {"rho": 0.05, "p": 2.0, "sam_gradient": "paper"}),
}


@pytest.mark.parametrize("name", VARIANTS)
def test_a_variant_states_only_the_defaults_it_changes_and_the_options_it_adds(name):
    parent, changed, added = VARIANTS[name]
    cls = method_class(name)
    assert method_options(cls) == method_options(method_class(parent)) | changed | added
    own = inspect.signature(cls.__init__).parameters
    assert set(own) - {"self", "kwargs"} == set(changed) | set(added)  # the parent's others are passed on
    assert cls().hparams().items() >= (changed | added).items()


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


@pytest.mark.parametrize("name", NAMES)
def test_every_builtin_choice_is_checked_with_the_one_line_error(name):
    cls = method_class(name)
    for field, allowed in choices(cls).items():
        with pytest.raises(ConfigError) as err:
            cls(**{field: "no-such-choice"})
        assert err.value.field == f"method.{field}" and all(str(v) in err.value.fix for v in allowed)


def test_choices_mirrored_from_pfl_optim_agree_with_it():
    assert get_args(fedpg.Solver) == minnorm.SOLVERS and get_args(fedpg.Rescale) == descent.RESCALES
    assert get_args(fedmgda.Solver) == capped_simplex.SOLVERS
    assert get_args(fedora.LambdaRule) == propagation.LAMBDA_RULES
    assert get_args(pfedhn.SamGradient) == hypernet.SAM_GRADIENTS
    assert get_args(rl_tuning.ActionMap) == ddpg.ACTION_MAPS and get_args(rl_tuning.Init) == ddpg.INIT_SCHEMES


def test_page_and_dapfl_ddpg_choices_are_literals_their_parser_validates():
    """Every choice among the shared agent options is a Literal in the signature jsonargparse reads."""
    signature = inspect.signature(rl_tuning.DDPGMethod.__init__).parameters
    expected = {
        "epoch_rounding": ("round", "floor"),
        "action_map": ddpg.ACTION_MAPS,
        "init": ddpg.INIT_SCHEMES,
        "warmup_space": ("agent", "hparams"),
        "replay_actions": ("agent", "mapped"),
        "reward_split": ("validation", "test"),
    }
    assert {name: get_args(signature[name].annotation) for name in expected} == expected
    for name in ("page", "dapfl"):
        with pytest.raises(ArgumentError):
            build_fit_parser(name).parse_args(["--method.epoch_rounding", "ceil"])


def test_page_and_dapfl_ddpg_params_are_frozen_and_documented_in_their_help():
    with pytest.raises(dataclasses.FrozenInstanceError):
        DapFL().ddpg.lr_min = 0.5  # type: ignore[misc]
    for name in ("page", "dapfl"):
        help_text = " ".join(build_fit_parser(name).format_help().split())
        assert "Adam learning rate of the actor" in help_text and "OU noise mean reversion" in help_text


def test_dapfl_weighting_is_a_choice_the_parser_validates():
    parser = build_fit_parser("dapfl")
    assert parser.parse_args(["--method.weighting", "uniform"]).method.weighting == "uniform"
    with pytest.raises(ArgumentError):
        parser.parse_args(["--method.weighting", "sizes"])
