"""Properties every registered method must have, checked in each method's own test file.

A method module's test file (``tests/methods/test_<module>.py``, mirroring ``pfl/methods/<module>.py``) runs
them as its ``TestRegistryProperties`` class, once per name the module registers: ``tests/methods/conftest.py``
adds that class (``properties_of``) to the file, so a new method gets these checks when its test file is
added, and ``python -m pytest tests/methods/test_<module>.py`` runs them with the file's own tests:

- it trains end to end, and the same seed gives the same numbers;
- a round does not depend on the order in which its clients are trained;
- a run resumed from a checkpoint (through torch.save / torch.load(weights_only=True), as --resume does)
  ends with the uninterrupted run's numbers;
- it declares whether it has a global and/or personal model, and describes itself;
- it declares whether its server averages the uploads (what robust aggregation needs);
- its class defaults are the settings of ``conf/method/<name>.yaml``, and ``hparams()`` (what summary.json
  and W&B record) are exactly the options its config can set;
- its defaults learn on the default experiment (``tests/methods/defaults_learn.py``).

Some properties hold for a part of the methods only, and the tables below name which: each runs once per
entry for the file's methods, and a file none of whose methods has an entry does not have the test at all:

- ``RESUMED_FROM_A_COPY``: two rounds, a deep copy of the state loaded into a fresh loop, and the next round
  is the same in both;
- ``OFFICIAL_CONFIGS``: the PGFed code's baselines, each with a ``conf/method/<name>_official.yaml``;
- ``PAPER_DEFAULTS``: the class defaults are its paper's config, what ``hparams()`` adds to it is neutral,
  and it declares its models;
- ``BOUNDS``: per method, ``(field, ok, bad)``: a hyperparameter accepted at ``ok`` and refused with a
  ``ConfigError`` naming ``method.<field>`` at ``bad``.
"""

from __future__ import annotations

import copy
import io
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from pfl.errors import ConfigError
from pfl.federation.loop import comparable_metrics
from pfl.methods import method_class, methods
from pfl.methods.registry import catalogue
from tests.conftest import make_loop, tiny_config
from tests.methods.defaults_learn import META_INITIALIZATION, floors, run_defaults

TINY = {"rounds": 3, "fraction": 0.5}
HALF = {"fraction": 0.5}
# Per-FedAvg's outer step (the paper's β = 0.005) barely moves a 3-round run; a larger one shows it trains.
ARGS = {"perfedavg": {"outer_lr": 0.05}}
# PAGE's and Dap-FL's agents score on validation splits (method.reward_split: validation).
DATA = {"page": {"val_frac": 0.2}, "dapfl": {"val_frac": 0.2}}
CONF = Path(__file__).resolve().parents[2] / "conf" / "method"

# (has_global_model, has_personal_model) of every method: what the evaluation reports (gm.*, P-models).
GLOBAL_ONLY = ("dapfl", "fedavg", "feddyn", "fedmgda_plus", "fedprox", "fedsam", "scaffold")
PERSONAL_ONLY = ("fedamp", "fedfomo", "fedora", "fedper", "fedrecon", "fedrep", "fesem", "fedu", "ifca", "lgfedavg")
PERSONAL_ONLY += ("local", "pfedhn", "plgu_ghn", "plgu_grep")
FLAGS = {n: (True, False) for n in GLOBAL_ONLY} | {n: (False, True) for n in PERSONAL_ONLY}
# Methods whose server does not take a weighted mean of the uploaded models: server.aggregator (median,
# Krum, ...) is refused for them, and every other method accepts it.
NOT_AVERAGING = ("fedamp", "fedfomo", "fedmgda_plus", "fedora", "fedpg", "fedu", "fesem", "ifca", "local")
NOT_AVERAGING += ("pfedhn", "plgu_ghn", "sfedpg")

# The methods each partial property is checked for (see the docstring).
RESUMED_FROM_A_COPY = ("apfl", "fedbabu", "feddyn", "fedfomo", "fedper", "fedrep", "fedrod", "lgfedavg")
RESUMED_FROM_A_COPY += ("perfedavg", "pfedme", "pgfed", "pgfedmo", "pgfed_ce")
OFFICIAL_CONFIGS = ("apfl", "fedavg", "fedbabu", "feddyn", "fedfomo", "fedper", "fedrep", "fedrod", "lgfedavg")
OFFICIAL_CONFIGS += ("local", "perfedavg", "pfedme", "pgfed", "pgfedmo")
PAPER_DEFAULTS = ("apfl", "ditto", "fedavg", "fedbabu", "feddyn", "fedfomo", "fedper", "fedprox", "fedrep")
PAPER_DEFAULTS += ("fedrod", "lgfedavg", "local", "perfedavg", "pfedme", "pgfed", "pgfedmo", "pgfed_ce")
BOUNDS: dict[str, tuple[tuple[str, Any, Any], ...]] = {
    "apfl": (("mix", 0.0, -0.01), ("mix", 1.0, 1.01), ("eval_mix", "local", "mixed"), ("mix_lr", 0.0, -0.01))
    + (("mix_decay", 0.0, -0.01),),
    "ditto": (("lam", 0.0, -0.01), ("personal_epochs", 1, 0), ("prox", "exact", "exactly")),
    "fedala": (("eta", 0.0, -0.01), ("rand_percent", 0.5, 0.0), ("rand_percent", 100.0, 100.01), ("layer_idx", 0, -1))
    + (("threshold", 0.0, -0.01), ("num_pre_loss", 1, 0), ("max_start_epochs", 1, 0)),
    "fedamp": (("alpha_k", 1e-6, 0.0), ("alpha_k", 1.0, float("inf")), ("sigma", 1e-6, 0.0), ("lam", 0.0, -0.01)),
    "fedavg": (("finetune_epochs", 0, -1), ("client_momentum", 0.0, -0.01), ("client_momentum", 0.99, 1.0)),
    "fedbabu": (("head_layers", 0, -1), ("finetune_epochs", 0, -1), ("finetune_lr", 1e-6, 0.0)),
    "feddyn": (("alpha", 0.0, -0.01), ("weighting", "samples", "median")),
    "fedfomo": (("num_models", 0, -1), ("val_frac", 0.01, 0.0), ("val_frac", 0.99, 1.0), ("epsilon", 0.0, -0.01))
    + (("epsilon", 1.0, 1.01), ("epsilon_decay", 0.0, -0.01)),
    "fedper": (("personal_layers", 0, -1),),
    "fedprox": (("mu", 0.0, -0.01),),
    "fedrep": (("head_epochs", 0, -1),),
    "fedrod": (("head_lr", 1e-6, 0.0), ("head_init", "init", "ones")),
    "fedsam": (("rho", 0.0, -0.01), ("p", 1.0, 0.99)),
    "fedu": (("eta", 1e-6, 0.0), ("eta", None, -0.01)),
    "lgfedavg": (("global_layers", 0, -1),),
    "perfedavg": (("inner_lr", 0.0, -0.01), ("outer_lr", 1e-6, 0.0), ("weighting", "samples", "median")),
    "pfedme": (("lam", 0.0, -0.01), ("inner_steps", 1, 0), ("personal_lr", 1e-6, 0.0), ("beta", 1e-6, 0.0))
    + (("personal_l2", 0.0, -0.01), ("weighting", "samples", "median")),
    "pgfed": (("mu", 0.0, -0.01), ("eta2", 0.0, -0.01), ("beta", 0.0, -0.01), ("beta", 0.99, 1.0))
    + (("alpha_init", 0.0, -0.01),),
    "pgfed_ce": (("ce_scalar", "mean", "sum"),),
}


def _config(name: str, args: dict | None = None):
    return tiny_config(name, args, trainer=TINY, data=DATA.get(name, {}))


def _state_equal(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_state_equal(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(_state_equal(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def over(attribute: str, argnames: str = "name") -> Callable[[Callable], Callable]:
    """Runs the property once per entry of the class attribute ``attribute`` (``argnames`` unpacks an entry)
    instead of once per name in ``METHODS``; ``tests/methods/conftest.py`` reads it."""

    def mark(test: Callable) -> Callable:
        test.parametrized_by = (attribute, argnames)
        return test

    return mark


class RegistryProperties:
    """Base of each method file's ``TestRegistryProperties`` (``properties_of``): ``METHODS`` names the
    methods to check, the attributes below the entries of the tables above for those methods."""

    METHODS: tuple[str, ...] = ()
    RESUMED_FROM_A_COPY: tuple[str, ...] = ()
    OFFICIAL_CONFIGS: tuple[str, ...] = ()
    PAPER_DEFAULTS: tuple[str, ...] = ()
    BOUNDS: tuple[tuple[str, str, Any, Any], ...] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for name in dir(cls):
            attribute = getattr(getattr(cls, name), "parametrized_by", (None,))[0]
            if attribute is not None and not getattr(cls, attribute):
                setattr(cls, name, None)  # no entries: no test (pytest collects only functions)

    def test_trains_end_to_end_and_is_deterministic(self, name):
        first = make_loop(_config(name, ARGS.get(name)))
        untrained = first.evaluate()["pm.l_loss.mean"]
        a = first.fit()
        b = make_loop(_config(name, ARGS.get(name))).fit()
        assert comparable_metrics(a) == comparable_metrics(b)
        assert a["metrics"]["pm.l_loss.mean"] < untrained, "training did not lower the P-models' test loss"

    def test_round_does_not_depend_on_client_order(self, name):
        forward, backward = (make_loop(_config(name)) for _ in range(2))
        train = backward.dispatcher.train  # the local updates run in reversed id order
        backward.dispatcher.train = lambda method, r, cids, payloads: train(method, r, list(reversed(cids)), payloads)
        for _ in range(2):
            forward.run_round(), backward.run_round()
        assert _state_equal(forward.server.state, backward.server.state)
        assert _state_equal(forward.clients, backward.clients)

    def test_resume_from_a_checkpoint_equals_the_uninterrupted_run(self, name):
        straight = make_loop(_config(name))
        straight.run_round()
        buffer = io.BytesIO()
        torch.save(straight.checkpointer.state_dict(), buffer)
        buffer.seek(0)
        resumed = make_loop(_config(name))
        resumed.checkpointer.load_state_dict(torch.load(buffer, weights_only=True))
        for _ in range(2):
            straight.run_round(), resumed.run_round()
        assert _state_equal(straight.server.state, resumed.server.state)
        assert _state_equal(straight.clients, resumed.clients)
        assert straight.evaluate()["pm.l_acc.mean"] == resumed.evaluate()["pm.l_acc.mean"]

    def test_declares_what_it_is_evaluated_on_and_describes_itself(self, name):
        cls = method_class(name)
        assert (cls.has_global_model, cls.has_personal_model) == FLAGS.get(name, (True, True))
        assert type(cls.has_global_model) is bool and type(cls.has_personal_model) is bool
        assert cls.name == name and isinstance(cls.description, str) and len(cls.description) > 20

    def test_declares_whether_its_server_averages_the_uploads(self, name):
        assert method_class(name).averages_uploads is (name not in NOT_AVERAGING)

    def test_class_defaults_are_the_settings_of_its_config_file(self, name):
        """conf/method/<name>.yaml is the paper's setting, and the class defaults say the same."""
        import yaml

        conf = dict(yaml.safe_load((CONF / f"{name}.yaml").read_text())["method"])
        default = method_class(conf.pop("name"))()
        assert {k: getattr(default, k) for k in conf} == conf
        if "finetune_epochs" not in conf:  # fixed by the class: no fine-tuning
            assert default.hparams().get("finetune_epochs", 0) == 0

    def test_hparams_are_the_options_its_config_can_set(self, name):
        from pfl.runner.args import build_fit_parser

        options = set(vars(build_fit_parser(name).get_defaults().method)) - {"name"}
        assert set(method_class(name)().hparams()) == options

    def test_defaults_learn_on_the_default_experiment(self, name, fedavg_run):
        reference, classes = fedavg_run
        metrics = reference if name == "fedavg" else run_defaults(name)[0]
        checked = {"pm.l_acc.mean": metrics["pm.l_acc.mean"]}
        if name not in META_INITIALIZATION and not math.isnan(metrics.get("gm.acc", math.nan)):
            checked["gm.acc"] = metrics["gm.acc"]
        floor = floors(reference, classes)
        low = {key: round(value, 4) for key, value in checked.items() if not value >= floor[key]}
        assert not low, f"{name} ends at {low}, under a third of FedAvg's gain over chance ({floor})"

    @over("RESUMED_FROM_A_COPY")
    def test_registered_runs_and_resumes_identically(self, name):
        assert name in methods()
        cfg = tiny_config(name, trainer=HALF)
        a = make_loop(cfg)
        a.run_round(), a.run_round()
        b = make_loop(cfg)
        b.checkpointer.load_state_dict(copy.deepcopy(a.checkpointer.state_dict()))
        a.run_round(), b.run_round()
        assert a.evaluate()["pm.l_acc.mean"] == b.evaluate()["pm.l_acc.mean"]
        for key, value in a.server.state.items():
            assert torch.equal(value, b.server[key]), key

    @over("OFFICIAL_CONFIGS")
    def test_every_baseline_of_the_pgfed_code_has_an_official_config(self, name):
        import yaml

        conf = yaml.safe_load((CONF / f"{name}_official.yaml").read_text())
        args = dict(conf["method"])
        method = method_class(args.pop("name"))(**args)
        assert conf["client"]["drop_last"] is True  # their loaders drop the last incomplete batch
        if hasattr(method, "client_momentum") and name not in ("perfedavg", "pfedme"):
            assert method.client_momentum in (0.0, 0.9)  # stated, so --client.momentum cannot change it
        paper = yaml.safe_load((CONF / f"{name}.yaml").read_text())["method"]
        assert paper["name"] == conf["method"]["name"] and paper != conf["method"]

    @over("PAPER_DEFAULTS")
    def test_defaults_are_the_paper_config_and_flags_are_declared(self, name):
        import yaml

        conf = dict(yaml.safe_load((CONF / f"{name}.yaml").read_text())["method"])
        cls = method_class(conf.pop("name"))
        default = cls()
        assert {k: getattr(default, k) for k in conf} == conf  # the class defaults are the paper's, as documented
        hparams = default.hparams()
        assert hparams.items() >= conf.items()
        neutral = {"finetune_epochs": 0, "share_buffers": True}
        inherited = {k: v for k, v in hparams.items() if k not in conf}
        assert inherited.items() <= neutral.items()
        fixed = {k: getattr(default, k) for k in cls.fixed_options}  # passed to the parent: neutral values
        assert fixed.items() <= neutral.items() and fixed.keys() == set(cls.fixed_options)
        assert (cls.has_global_model, cls.has_personal_model) == FLAGS.get(name, (True, True))
        assert cls.name == name and len(cls.description) > 20

    @over("BOUNDS", "name, field, ok, bad")
    def test_hyperparameters_are_checked_at_their_bounds(self, name, field, ok, bad):
        cls = method_class(name)
        assert getattr(cls(**{field: ok}), field) == ok
        with pytest.raises(ConfigError, match=f"method.{field}"):
            cls(**{field: bad})


def properties_of(module: str) -> type[RegistryProperties] | None:
    """The ``TestRegistryProperties`` of ``tests/methods/test_<module>.py``: the properties of the methods
    ``pfl/methods/<module>.py`` registers, with their entries of the tables above; None when it registers none."""
    listed = catalogue()
    modules = {n: m.module for n, m in listed.items()} if listed else {n: c.__module__ for n, c in methods().items()}
    names = tuple(n for n, m in modules.items() if m == f"pfl.methods.{module}")
    if not names:
        return None
    attributes = {
        "METHODS": names,
        "RESUMED_FROM_A_COPY": tuple(n for n in RESUMED_FROM_A_COPY if n in names),
        "OFFICIAL_CONFIGS": tuple(n for n in OFFICIAL_CONFIGS if n in names),
        "PAPER_DEFAULTS": tuple(n for n in PAPER_DEFAULTS if n in names),
        "BOUNDS": tuple((n, *bound) for n in names for bound in BOUNDS.get(n, ())),
        "__module__": f"tests.methods.test_{module}",
    }
    return type("TestRegistryProperties", (RegistryProperties,), attributes)
