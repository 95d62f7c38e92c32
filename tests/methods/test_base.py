"""Tests of pfl/methods/base.py: how methods declare their hyper-parameters (the client-optimizer options
once, variants stating only the defaults they change) and what the command line sees of them."""

from __future__ import annotations

import contextlib
import inspect
import io
import json
import math
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
import yaml

from pfl.cli import list_methods, main
from pfl.data import DataConfig, build_data
from pfl.engine.flat import ModelLayout
from pfl.engine.trainer import ClientTrainer, TrainSettings
from pfl.errors import ConfigError
from pfl.methods import ClientOptimizerMethod, Method, Upload, method_class, register
from pfl.methods.base import ClientContext, ServerContext, weighted_mean
from pfl.methods.registry import _REGISTRY
from pfl.metrics.comm import nbytes
from pfl.models import ModelConfig, build_model
from pfl.runner.args import build_fit_parser
from pfl.runner.plan import train_settings
from tests.conftest import make_loop, tiny_config
from tests.methods.helpers import REGISTERED as NAMES
from tests.methods.helpers import _bare_server, _one_client, method_options
from tests.methods.reference import drawn_batches, flat_params, initial_net


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


CONF = Path(__file__).resolve().parents[2] / "conf"


@pytest.mark.parametrize("path", sorted((CONF / "method").glob("*.yaml")), ids=lambda p: p.stem)
def test_method_configs_build_their_method(path):
    args = dict(yaml.safe_load(path.read_text())["method"])
    method = method_class(args.pop("name"))(**args)
    assert all(getattr(method, k) == v for k, v in args.items())


def test_digits_experiment_runs_every_new_method_from_the_cli(tmp_path):
    exp = str(CONF / "experiment" / "pgfed_digits_dir03.yaml")
    for name in ("pgfed_official", "fedrod"):
        rc = main(
            ["fit", "--config", exp, "--config", str(CONF / "method" / f"{name}.yaml"), "--trainer.rounds", "1"]
            + ["--trainer.progress", "false", "--tracking.root", str(tmp_path), "--tracking.name", name]
        )
        assert rc == 0
        summary = json.loads((tmp_path / name / "summary.json").read_text())
        assert summary["num_clients"] == 25 and summary["metrics"]["pm.l_acc.mean"] > 0


def _worker(**settings):
    data = build_data(DataConfig(source="digits", num_clients=2, alpha=1.0, min_samples=20), 0)
    net = build_model(ModelConfig(name="mlp", hidden=[8]), data.input_shape, data.num_classes)
    return ClientTrainer(net, data, TrainSettings(**{"epochs": 2, "batch_size": 16, "lr": 0.1, **settings}), seed=0)


def test_drop_last_drops_exactly_the_remainder_batch():
    full, dropped = _worker(), _worker(drop_last=True)
    n = len(full.data.clients[0].train)
    assert n % 16
    a = list(full.epoch_batches(0, 3, "train", 2))
    b = list(dropped.epoch_batches(0, 3, "train", 2))
    per_epoch = -(-n // 16)
    remainders = [per_epoch - 1, 2 * per_epoch - 1]
    assert [len(x) for _, x in a if len(x) < 16] == [n % 16, n % 16]
    kept = [pair for i, pair in enumerate(a) if i not in remainders]
    assert len(b) == len(kept) and all(e == f and torch.equal(x, y) for (e, x), (f, y) in zip(b, kept, strict=True))
    small = _worker(drop_last=True, batch_size=10_000)  # fewer samples than one batch: one batch of all
    assert [len(x) for _, x in small.epoch_batches(0, 0, "train", 1)] == [n]


def test_kept_momentum_is_one_optimizer_over_rounds_for_any_method():
    lr = 0.1
    for name, args in (("fedavg", {}), ("local", {}), ("fedprox", {"mu": 0.0}), ("fedper", {"personal_layers": 0})):
        cfg, loop = _one_client(name, args, rounds=2, momentum=0.9, keep_momentum=True)
        net = initial_net(cfg, loop)
        opt = torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9)
        data, idx = loop.worker.data, loop.worker.data.clients[0].train
        for r in range(2):
            for b in drawn_batches(cfg.seed, r, 0, "train", idx, 16):
                opt.zero_grad()
                F.cross_entropy(net(data.x[b]), data.y[b]).backward()
                opt.step()
        model = loop.clients[0]["personal"] if name == "local" else loop.server["global"]
        torch.testing.assert_close(model, flat_params(net), rtol=1e-5, atol=1e-6, msg=name)
        # The method's own setting wins over client.keep_momentum.
        _, fresh = _one_client(name, {**args, "keep_momentum": False}, rounds=2, momentum=0.9, keep_momentum=True)
        other = fresh.clients[0]["personal"] if name == "local" else fresh.server["global"]
        assert not torch.allclose(other, model, atol=1e-4), name


def test_method_momentum_overrides_the_client_setting():
    def global_after(args, momentum):
        loop = make_loop(tiny_config("fedavg", args, client={"momentum": momentum}))
        loop.run_round()
        return loop

    base = global_after({}, 0.0)
    overridden = global_after({"client_momentum": 0.0}, 0.9)
    assert overridden.worker.settings.momentum == 0.0
    assert torch.equal(base.server["global"], overridden.server["global"])
    assert not torch.equal(base.server["global"], global_after({}, 0.9).server["global"])


def test_method_optimizer_override_wins_on_the_command_line_and_is_recorded(tmp_path):
    common = ["fit", "--method", "fedavg", "--trainer.rounds", "1", "--data.num_clients", "6", "--model.hidden", "[16]"]
    common += ["--trainer.progress", "false", "--tracking.wandb", "false", "--tracking.root", str(tmp_path)]
    runs = {
        "override": ["--method.client_momentum", "0.0", "--client.momentum", "0.9"],
        "plain": ["--client.momentum", "0.0"],
        "momentum": ["--client.momentum", "0.9"],
    }
    out = {}
    for name, extra in runs.items():
        assert main([*common, *extra, "--tracking.name", name]) == 0
        out[name] = json.loads((tmp_path / name / "summary.json").read_text())
    assert out["override"]["hparams"]["client_momentum"] == 0.0
    assert out["plain"]["hparams"]["client_momentum"] is None
    acc = {k: v["metrics"]["pm.l_loss.mean"] for k, v in out.items()}
    assert acc["override"] == acc["plain"] != acc["momentum"]


def test_client_optimizer_settings_are_validated():
    from pfl.errors import ConfigError
    from pfl.methods import method_class

    with pytest.raises(ConfigError, match="method.client_momentum"):
        method_class("fedavg")(client_momentum=1.0)
    with pytest.raises(ConfigError, match="method.ce_scalar"):
        method_class("pgfed_ce")(ce_scalar="sum")
    with pytest.raises(ConfigError, match="method.eval_mix"):
        method_class("apfl")(eval_mix="best")
    with pytest.raises(ConfigError, match="method.epsilon"):
        method_class("fedfomo")(epsilon=2.0)


def test_new_settings_reach_the_worker():
    cfg = tiny_config("pgfed", {"keep_momentum": True, "client_momentum": 0.5}, client={"drop_last": True})
    s = make_loop(cfg).worker.settings
    assert (s.momentum, s.keep_momentum, s.drop_last) == (0.5, True, True)
    s = make_loop(tiny_config("pgfed", client={"momentum": 0.3, "keep_momentum": True})).worker.settings
    assert (s.momentum, s.keep_momentum, s.drop_last) == (0.3, True, False)


def _api_loop(name: str = "fedavg"):
    return make_loop(tiny_config(name))


def test_an_empty_upload_carries_nothing_and_counts_no_bytes():

    a, b = Upload(), Upload()
    assert a.state is None and a.weight == 0.0 and a.extras == {} and "loss" not in a
    assert a.extras is not b.extras  # each upload its own dict
    assert nbytes(a) == 0


def test_server_context_defaults_and_the_callables_it_does_not_show():
    layout = _api_loop().worker.flat.layout
    init = torch.zeros(layout.num_params + layout.num_buffers)
    a = ServerContext(0, 4, 2, layout, init)
    lr_at = lambda r: 0.1 * 0.5**r  # noqa: E731
    b = ServerContext(0, 4, 2, layout, init, evaluator=lambda s: None, client_loss=lambda c, s: 0.0, client_lr_at=lr_at)
    assert a.state == {} and a.state is not b.state and a.seed == 0
    assert "evaluator" not in repr(b) and "client_loss" not in repr(b) and "seed=0" in repr(b)
    assert "client_lr_at" not in repr(b) and "client_lr_at" not in repr(a)
    assert "reports" not in repr(a) and a.reports is not b.reports  # each server its own sums
    assert b.client_lr == 0.1
    b.round = 2
    assert b.client_lr == 0.025  # the round's clients' lr, decayed
    with pytest.raises(RuntimeError, match="no global test set"):
        a.evaluate(init)
    with pytest.raises(RuntimeError, match="cannot ask clients"):
        a.ask_loss(0, init)
    with pytest.raises(RuntimeError, match="does not know its clients' learning rate"):
        _ = a.client_lr
    with pytest.raises(RuntimeError, match="cannot build its network again"):
        a.fresh_init(0)


def test_server_context_fresh_init_draws_the_parameters_and_keeps_the_buffers():
    layout = ModelLayout(3, 2, (("0", slice(0, 3)),), torch.device("cpu"))
    init = torch.arange(5, dtype=torch.float64)
    server = ServerContext(0, 4, 2, layout, init, draw_params=lambda *keys: torch.full((3,), float(len(keys))))
    fresh = server.fresh_init(0, "ifca", 1)  # drawn in float32, stored as init_state is
    assert torch.equal(fresh, torch.tensor([3.0, 3.0, 3.0, 3.0, 4.0], dtype=torch.float64))
    assert torch.equal(init, torch.arange(5, dtype=torch.float64))  # a new vector: init_state is kept
    assert "draw_params" not in repr(server)


def test_client_context_keeps_momentum_under_the_purposes_key_and_hides_the_worker():
    loop = _api_loop()
    ctx = loop.client(0)
    assert "worker" not in repr(ctx)
    start = loop.server["global"]
    ctx.fit(start, momentum=0.9, keep_momentum=True)
    assert set(ctx.state) == {"momentum"}
    ctx.fit(start, momentum=0.9, keep_momentum=True, purpose="finetune")
    assert set(ctx.state) == {"momentum", "momentum.finetune"}
    kept = ctx.state["momentum"].clone()
    ctx.fit(start, momentum=0.9, purpose="finetune")  # keep_momentum None: only "train" fits keep it
    assert torch.equal(ctx.state["momentum"], kept)


def test_record_fit_counts_the_samples_of_every_epoch():
    ctx = _api_loop().client(0)
    started = time.perf_counter()
    ctx.record_fit(steps=3, epochs=2, started=started)
    (fit,) = ctx.fits
    assert fit.samples_seen == 2 * ctx.num_samples and fit.steps == 3 and math.isnan(fit.loss)
    assert 0 <= fit.seconds < 60


def test_method_defaults_a_user_method_inherits():
    class Bare(Method):  # no description, no set_client_optimizer
        name = "_bare_for_test"

    assert Bare.client_momentum is None and Bare.keep_momentum is None
    cfg = tiny_config("fedavg", client={"momentum": 0.5, "keep_momentum": True})
    settings = train_settings(cfg.client, Bare())
    assert settings.momentum == 0.5 and settings.keep_momentum is True  # the run's settings apply
    assert Bare().comm_extra(_bare_server()) == (0, 0) and Bare().metrics(_bare_server()) == {}
    register(Bare)
    try:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            list_methods()
        (line,) = [row for row in out.getvalue().splitlines() if row.startswith("_bare_for_test")]
        assert line.rstrip() == "_bare_for_test"  # an empty description, not "None"
    finally:
        _REGISTRY.pop("_bare_for_test", None)


def test_personal_state_is_the_clients_own_model_unless_the_method_has_only_a_global_one():
    loop = _api_loop()
    ctx = loop.client(0)
    ctx.state["personal"] = torch.full_like(loop.server["global"], 3.0)

    class Both(Method):
        name = "both"

    class GlobalOnly(Method):
        name = "global_only"
        has_personal_model = False

    class Neither(Method):
        name = "neither"
        has_personal_model = has_global_model = False

    assert Both().personal_state(loop.server, ctx) is ctx.state["personal"]
    assert GlobalOnly().personal_state(loop.server, ctx) is loop.server["global"]
    assert Neither().personal_state(loop.server, ctx) is ctx.state["personal"]


def test_default_new_client_adaptation_fine_tunes_the_global_model_or_the_initial_one():
    loop = _api_loop()
    loop.run_round()
    new = ClientContext(1, loop.round, loop.worker, {}, loop.init_state)
    assert loop.method.adapt_new_client(loop.server, new, 0) is loop.server["global"]
    tuned = loop.method.adapt_new_client(loop.server, new, 1)
    assert not torch.equal(tuned, loop.server["global"]) and new.fits[-1].samples_seen == new.num_samples
    local = _api_loop("local")
    assert local.method.adapt_new_client(local.server, new, 0) is loop.init_state


def test_hparams_are_the_init_arguments_in_method_resolution_order():
    """A class's options are its own ``__init__`` arguments and, through ``**kwargs``, its parents' in
    method resolution order (as jsonargparse follows them), less the ``fixed_options`` it passes itself."""

    class Base(Method):
        def __init__(self, x=1):
            self.x = x

    class Left(Base):  # no __init__ of its own
        pass

    class Right(Base):
        def __init__(self, b=2, **extra):
            super().__init__(**extra)
            self.b, self.extra = b, extra  # kept as an attribute, yet ``**extra`` is not an option

    class Diamond(Left, Right):
        def __init__(self, c=3, **kwargs):
            super().__init__(**kwargs)
            self.c = c

    class Closed(Left, Right):  # takes no **kwargs: its parents' arguments are not its options
        def __init__(self, c=3):
            super().__init__()
            self.c = c

    class Fixing(Diamond):
        fixed_options = ("b",)

        def __init__(self, d=4, **kwargs):
            super().__init__(b=5, **kwargs)
            self.d = d

    assert list(Diamond().hparams()) == ["c", "b", "x"]
    assert list(Closed().hparams()) == ["c"]
    assert Fixing().hparams() == {"d": 4, "c": 3, "x": 1}


def test_weighted_mean_refuses_vectors_and_weights_of_different_lengths():
    v = torch.ones(3)
    torch.testing.assert_close(weighted_mean([v, 3 * v], [1.0, 3.0]), 2.5 * v)
    with pytest.raises(ValueError):
        weighted_mean([v, v], [1.0])


def test_the_base_method_is_vectorizable_and_a_method_names_what_it_gains_nothing_from():
    # Lockstep runs any method whose clients' updates are independent: the base flag is True.
    assert Method.vectorizable is True
    assert Method().vectorize_problems() == []
    method = Method()
    method.name = "m"
    line = "m's x: its clients train one at a time, so trainer.vectorize gains nothing"
    assert method.runs_one_at_a_time("x") == [line]


def test_a_method_without_a_name_is_named_after_its_class_and_register_still_asks_for_one():
    class MyMethod(Method):
        pass

    class Refined(MyMethod):  # its parent's default is not its name
        pass

    class Named(Method):
        name = "named_on_purpose"

    class Child(Named):  # a name set on purpose is inherited
        pass

    class Blank(Named):
        name = ""  # an empty name is no name

    assert [c.name for c in (MyMethod, Refined, Named, Child, Blank)] == [
        "mymethod", "refined", "named_on_purpose", "named_on_purpose", "blank"
    ]  # fmt: skip
    assert [c.name_from_class for c in (MyMethod, Refined, Named, Child, Blank)] == [True, True, False, False, True]
    assert MyMethod().name == "mymethod" and Method.name == ""
    for cls in (MyMethod, Refined, Blank):
        with pytest.raises(ValueError, match=f"{cls.__qualname__} needs a class attribute `name`"):
            register(cls)
