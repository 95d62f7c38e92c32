"""Tests of pfl/methods/base.py: how methods declare their hyper-parameters (the client-optimizer options
once, variants stating only the defaults they change) and what the command line sees of them."""

from __future__ import annotations

import inspect
from typing import Any

import pytest

from pfl.errors import ConfigError
from pfl.methods import ClientOptimizerMethod, method_class
from pfl.runner.args import build_fit_parser
from tests.methods_helpers import REGISTERED as NAMES
from tests.methods_helpers import method_options


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
