"""The method API: server optimizers, SCAFFOLD, Lightning-style objectives, precision, user plug-ins."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import textwrap
from pathlib import Path

import lightning as L
import pytest
import torch
import yaml
from lightning.fabric.plugins.precision import MixedPrecision

from pfl.config import ServerConfig
from pfl.engine.fit_spec import FitSpec, FitStats, mean_of
from pfl.engine.terms import Proximal
from pfl.engine.trainer import ClientModule
from pfl.errors import ConfigError
from pfl.federation.server_opt import ServerOptimizer
from pfl.methods import method_class
from pfl.methods.ditto import Ditto
from tests.conftest import make_loop, tiny_config
from tests.helpers.cli_runs import child_env

ROOT = Path(__file__).resolve().parents[2]
HALF = {"rounds": 3, "fraction": 0.5}


# -- server optimizers ----------------------------------------------------------------------------
def test_default_server_step_is_plain_averaging_bit_for_bit():
    a = make_loop(tiny_config("fedavg", trainer=HALF))
    b = make_loop(tiny_config("fedavg", trainer=HALF))
    b.server_optimizer = ServerOptimizer(ServerConfig())
    forced = ServerOptimizer(ServerConfig(lr=1.0))
    forced.cfg = ServerConfig(lr=1.0 + 1e-12)  # not the identity any more: the step itself runs
    c = make_loop(tiny_config("fedavg", trainer=HALF))
    c.server_optimizer = ServerOptimizer(ServerConfig(momentum=1e-30))
    for _ in range(2):
        a.run_round(), b.run_round(), c.run_round()
    assert torch.equal(a.server["global"], b.server["global"])
    torch.testing.assert_close(a.server["global"], c.server["global"], rtol=0, atol=1e-6)


def _two_rounds_by_hand(server: ServerConfig, update) -> None:
    """Run FedAvg with ``server`` for two rounds and compare with ``update(prev, avg, state)``."""
    loop = make_loop(tiny_config("fedavg", trainer=HALF, server=server))
    plain = make_loop(tiny_config("fedavg", trainer=HALF))
    state: dict = {}
    for _ in range(2):
        prev = loop.server["global"].clone()
        plain.server.state["global"] = prev.clone()
        plain.progress.round = loop.round
        plain.run_round()
        loop.run_round()
        expected = update(prev, plain.server["global"], state)
        torch.testing.assert_close(loop.server["global"], expected, rtol=1e-5, atol=1e-6)


def test_fedavgm_is_momentum_on_the_pseudo_gradient():
    def update(prev, avg, state):
        state["m"] = 0.9 * state.get("m", 0) + (prev - avg)
        return prev - 0.5 * state["m"]

    _two_rounds_by_hand(ServerConfig(optimizer="sgd", lr=0.5, momentum=0.9), update)


@pytest.mark.parametrize("kind", ["adam", "yogi", "adagrad"])
def test_adaptive_server_optimizers_follow_reddi_et_al(kind):
    b1, b2, tau, lr = 0.9, 0.99, 1e-3, 0.01

    def update(prev, avg, state):
        g = prev - avg
        state["m"] = b1 * state.get("m", 0) + (1 - b1) * g
        v = state.get("v", torch.zeros_like(g))
        if kind == "adam":
            v = b2 * v + (1 - b2) * g * g
        elif kind == "adagrad":
            v = v + g * g
        else:
            v = v - (1 - b2) * g * g * torch.sign(v - g * g)
        state["v"] = v
        return prev - lr * state["m"] / (v.sqrt() + tau)

    _two_rounds_by_hand(ServerConfig(optimizer=kind, lr=lr, beta1=b1, beta2=b2, tau=tau), update)


def test_server_optimizer_state_resumes_with_the_server():
    cfg = tiny_config("fedavg", trainer=HALF, server={"optimizer": "adam", "lr": 0.01})
    a = make_loop(cfg)
    a.run_round()
    assert {"server_opt.m", "server_opt.v"} <= set(a.server.state)
    b = make_loop(cfg)
    b.checkpointer.load_state_dict(a.checkpointer.state_dict())
    a.run_round(), b.run_round()
    assert torch.equal(a.server["global"], b.server["global"])


@pytest.mark.parametrize(
    "field,value", [("optimizer", "lamb"), ("lr", 0.0), ("momentum", 1.0), ("tau", 0.0), ("beta2", -0.1)]
)
def test_bad_server_settings_are_refused(field, value):
    from pfl.config import validate

    with pytest.raises(ConfigError, match=f"server.{field}"):
        validate(tiny_config("fedavg", server={field: value}))


# -- Lightning-style objectives -------------------------------------------------------------------
def test_ditto_as_a_training_step_equals_the_proximal_term():
    """The Lightning way (ProximalObjective's training_step, autograd) gives the term path's model."""
    terms = make_loop(tiny_config("ditto", {"prox": "gradient", "lam": 0.5}, trainer=HALF))
    module = make_loop(tiny_config("ditto", {"prox": "autograd", "lam": 0.5}, trainer=HALF))
    for _ in range(2):
        terms.run_round(), module.run_round()
    assert terms.clients.keys() == module.clients.keys()
    for cid in terms.clients:
        torch.testing.assert_close(terms.clients[cid]["personal"], module.clients[cid]["personal"], rtol=0, atol=1e-6)
    exact = make_loop(tiny_config("ditto", {"prox": "exact", "lam": 0.5}, trainer=HALF))
    exact.run_round(), exact.run_round()
    cid = next(iter(exact.clients))
    assert not torch.equal(exact.clients[cid]["personal"], module.clients[cid]["personal"])


class ManualSGD(ClientModule):
    """The plain objective written with manual optimisation: zero_grad, backward, step."""

    def __init__(self, net, task="classification"):
        super().__init__(net, task)
        self.automatic_optimization = False

    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        opt.zero_grad()
        x, y = batch
        loss = self.loss(self(x), y)
        self.manual_backward(loss)
        opt.step()
        return loss


def test_manual_optimisation_equals_the_automatic_step_with_terms():
    loop = make_loop(tiny_config("fedavg", trainer=HALF))
    ctx = loop.client(0)
    start = loop.init_state
    anchor = torch.zeros(loop.flat.num_params)
    auto = ctx.fit(start, terms=[Proximal(anchor, 0.3)])
    manual = ctx.fit(start, terms=[Proximal(anchor, 0.3)], objective=ManualSGD)
    torch.testing.assert_close(auto, manual, rtol=0, atol=1e-6)
    assert not torch.equal(auto, start)


# -- precision --------------------------------------------------------------------------------------
def test_a_gradient_scaler_is_used_and_unscaled_before_the_terms():
    cfg = tiny_config("fedprox", {"mu": 0.5}, trainer={"rounds": 1})
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    scaled = make_loop(cfg, fabric=L.Fabric(accelerator="cpu", plugins=[MixedPrecision("16-mixed", "cpu", scaler)]))
    plain = make_loop(cfg, fabric=L.Fabric(accelerator="cpu"))
    scaled.run_round(), plain.run_round()
    steps = sum(len(list(scaled.client(c).batches())) for c in scaled.sampled_clients().tolist())
    assert scaler.get_scale() == 1024.0 and int(scaler._get_growth_tracker()) == steps  # every step went through it
    diff = (scaled.server["global"] - plain.server["global"]).norm() / (
        plain.server["global"] - plain.init_state
    ).norm()
    assert diff < 1e-2  # fp16 autocast noise; an unscaled step would be ~1000x off


@pytest.mark.parametrize(
    ("name", "args", "key"),
    [("apfl", {}, "v"), ("apfl", {"mix_lr": 0.5}, "mix"), ("fedrod", {}, "head"), ("splitgp", {}, "head")],
    ids=["apfl-v", "apfl-alpha", "fedrod-head", "splitgp-head"],
)
def test_a_tensor_trained_beside_the_model_is_unscaled_with_it(name, args, key):
    """APFL's v and α, FedRoD's and SplitGP's personal heads take their steps from gradients of the same
    scaled backward: unscaled with the model's, they move as without a scaler (an unscaled step: 1024x)."""
    cfg = tiny_config(name, args, trainer={"rounds": 1})
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    scaled = make_loop(cfg, fabric=L.Fabric(accelerator="cpu", plugins=[MixedPrecision("16-mixed", "cpu", scaler)]))
    plain = make_loop(cfg, fabric=L.Fabric(accelerator="cpu"))
    scaled.run_round(), plain.run_round()
    for cid in plain.sampled_clients().tolist():
        got, want = scaled.client(cid).state[key], plain.client(cid).state[key]
        assert (got - want).norm() <= 1e-2 * want.norm(), (cid, got, want)  # fp16 autocast noise only


def test_a_skipped_scaled_step_leaves_the_tensors_trained_beside_the_model_without_a_gradient():
    from pfl.engine.terms import ExtraParamSGD

    loop = make_loop(tiny_config("fedavg", trainer={"rounds": 1}))
    worker = loop.worker
    extra = torch.ones(3, requires_grad=True)
    extra.grad = torch.full((3,), 2048.0)
    step = ExtraParamSGD(extra, lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    scaler.scale(torch.ones(()))  # a scaled loss, as every step's backward has
    worker.scaler = scaler
    net_param = next(p for p in worker.module.parameters() if p.requires_grad)
    optimizer = torch.optim.SGD([net_param], lr=0.1)
    net_param.grad = torch.full_like(net_param, 1024.0)
    worker.apply_step(optimizer, [step], 0.1)
    torch.testing.assert_close(extra.detach(), torch.full((3,), 1.0 - 0.1 * 2.0))  # 2048 / 1024, then the step
    assert extra.grad is None
    extra.grad = torch.full((3,), 2048.0)
    net_param.grad = torch.full_like(net_param, float("inf"))  # the scaler skips this step
    worker.apply_step(optimizer, [step], 0.1)
    torch.testing.assert_close(extra.detach(), torch.full((3,), 0.8))  # not stepped
    assert extra.grad is None and scaler.get_scale() < 1024.0  # nor carried into the next step


@pytest.mark.parametrize("precision", ["bf16-true", "64-true", "bf16-mixed"])
def test_every_fabric_precision_runs(precision):
    cfg = tiny_config("fedprox", trainer={"rounds": 1, "precision": precision})
    loop = make_loop(cfg, fabric=L.Fabric(accelerator="cpu", precision=precision))
    summary = loop.fit()
    want = {"bf16-true": torch.bfloat16, "64-true": torch.float64, "bf16-mixed": torch.float32}[precision]
    assert loop.worker.flat.state.dtype == want and summary["metrics"]["pm.l_acc.mean"] > 0


def test_fabric_layers_are_skipped_only_where_they_are_the_identity():
    """32-true calls loss.backward() directly (the same bits as through Fabric); a mixed precision's
    autocast and scaler hooks are always taken."""
    cfg = tiny_config("fedavg", trainer={"rounds": 1})
    direct = make_loop(cfg, fabric=L.Fabric(accelerator="cpu"))
    layered = make_loop(cfg, fabric=L.Fabric(accelerator="cpu"))
    layered.worker._direct_backward = layered.worker._direct_forward = False
    calls = []
    backward = layered.worker.fabric.backward
    layered.worker.fabric.backward = lambda loss: (calls.append(1), backward(loss))  # type: ignore[method-assign]
    direct.run_round(), layered.run_round()
    assert calls and torch.equal(direct.server["global"], layered.server["global"])
    assert (direct.worker._direct_backward, direct.worker._direct_forward) == (True, True)
    mixed = make_loop(cfg, fabric=L.Fabric(accelerator="cpu", precision="bf16-mixed"))
    assert (mixed.worker._direct_backward, mixed.worker._direct_forward) == (False, False)


def test_accelerator_defaults_to_auto():
    assert tiny_config().trainer.accelerator == "auto"


# -- registration and user methods ----------------------------------------------------------------
def test_method_class_accepts_an_import_path_and_refuses_non_methods():
    assert method_class("pfl.methods.ditto.Ditto") is Ditto
    with pytest.raises(ConfigError, match="method.name"):
        method_class("pfl.methods.ditto.ProxMode")
    with pytest.raises(ConfigError, match="method.name"):
        method_class("nosuchpackage.Method")


USER_METHOD = '''
from pfl.methods import Method, Upload, weighted_mean_of


class Shrink(Method):
    """FedAvg whose server shrinks the average towards zero by a factor."""

    name = "shrink"
    averages_uploads = False  # it scales the mean: a robust aggregator may not stand in for it

    def __init__(self, factor: float = 0.9):
        self.factor = factor

    def local_update(self, client, payload):
        return Upload(client.fit(payload["global"]), client.num_samples)

    def aggregate(self, server, uploads):
        server["global"] = self.factor * weighted_mean_of(uploads)
'''


def _pfl(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = child_env(WANDB_MODE="disabled")
    return subprocess.run([sys.executable, "-m", "pfl", *args], cwd=cwd, env=env, capture_output=True, text=True)


def test_a_user_method_outside_pfl_runs_resumes_and_sweeps(tmp_path, monkeypatch, request):
    from pfl.cli import main

    (tmp_path / "mymethods.py").write_text(textwrap.dedent(USER_METHOD))
    common = ["--config", str(ROOT / "conf/default.yaml"), "--data.num_clients", "4", "--model.hidden", "[16]"]
    common += ["--tracking.wandb", "false", "--trainer.progress", "false", "--tracking.root", "runs"]
    user = ["--method", "mymethods.Shrink", "--method.factor", "0.95"]
    # The fits run in this process, in the user's folder as `python -m pfl` would (its module importable
    # from there); the sweep below is the command line itself, its runs in a worker process.
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    request.addfinalizer(lambda: sys.modules.pop("mymethods", None))
    assert main(["fit", *common, *user, "--trainer.rounds", "4", "--tracking.name", "full"]) == 0
    assert main(["fit", *common, *user, "--trainer.rounds", "2", "--tracking.name", "part"]) == 0
    assert "name: mymethods.Shrink" in (tmp_path / "runs/part/config.yaml").read_text()
    sys.modules.pop("mymethods")  # the resume imports the method from its folder again, as a new process does
    assert main(["fit", "--resume", "runs/part", "--trainer.rounds", "4"]) == 0
    a, b = (json.loads((tmp_path / f"runs/{n}/summary.json").read_text()) for n in ("full", "part"))
    assert a["hparams"] == b["hparams"] == {"factor": 0.95} and a["rounds"] == b["rounds"] == 4
    timing = ("throughput.", "time.")
    assert {k: v for k, v in a["metrics"].items() if not k.startswith(timing)} == {
        k: v for k, v in b["metrics"].items() if not k.startswith(timing)
    }
    sweep = tmp_path / "shrink.yaml"
    spec = {
        "program": "pfl",
        "method": "grid",
        "parameters": {"method.factor": {"values": [0.8, 0.9]}},
        "command": ["fit", *common, "--trainer.rounds", "1", "--method", "mymethods.Shrink", "${args}"],
    }
    sweep.write_text(yaml.safe_dump(spec))
    swept = _pfl(tmp_path, "sweep", str(sweep), "--root", "sweep")
    assert swept.returncode == 0, swept.stderr
    factors = sorted(
        json.loads(p.read_text())["hparams"]["factor"] for p in (tmp_path / "sweep").glob("*/summary.json")
    )
    assert factors == [0.8, 0.9]


def test_key_value_overrides_are_accepted_as_sweep_agents_write_them():
    from pfl.runner.args import parse_fit_args

    cfg, *_ = parse_fit_args(["method.name=fedprox", "method.mu=0.3", "trainer.rounds=2"])
    assert cfg.method.name == "fedprox" and cfg.method.mu == 0.3 and cfg.trainer.rounds == 2


def test_conflict_fraction_counts_clients_whose_pseudo_gradient_opposes_the_update():
    from pfl.methods import Upload

    loop = make_loop(tiny_config("fedavg", trainer=HALF))
    size, p = loop.flat.layout.size, loop.flat.num_params
    previous, new = torch.zeros(size), torch.zeros(size)
    previous[0], new[0] = 0.5, 1.5  # the applied update Δ = e_0
    clients = [torch.zeros(size) for _ in range(4)]
    for w, first in zip(clients, (2.5, 0.0, -1.0, 0.5), strict=True):
        w[0] = first  # g = w − w_i along Δ: −2, +0.5, +1.5, 0 (the last one moved sideways only)
    clients[3][1] = 5.0
    shared_part = Upload(torch.zeros(p - 1), 1.0)  # not a full model: not counted
    uploads = {i: Upload(w, 1.0) for i, w in enumerate(clients)} | {4: shared_part}
    loop.evals.observe_update(previous, new, uploads)
    assert loop.evals.conflicts == [pytest.approx(0.5)]
    assert loop.evaluate()["conflict.fraction"] == pytest.approx(0.5)


def test_conflict_fraction_is_measured_in_the_evaluated_round_only():
    # eval_every 3 over 4 rounds: fit evaluates after rounds 3 and 4; rounds 1 and 2 cost no pass over the uploads.
    loop = make_loop(tiny_config("fedavg", trainer={"rounds": 4, "eval_every": 3}))
    seen = []
    observe = loop.evals.observe_update
    loop.evals.observe_update = lambda *a: (seen.append(loop.round + 1), observe(*a))
    loop.fit()
    assert seen == [3, 4]
    assert [("conflict.fraction" in m) for m in loop.history] == [True, True]
    assert [loop.evaluates_after(r) for r in range(1, 5)] == [False, False, True, True]


def test_a_fit_without_batches_reports_no_loss_and_leaves_the_round_mean_alone():
    loop = make_loop(tiny_config("fedavg"))
    stats = loop.worker.train(0, loop.server["global"], 0, FitSpec(epochs=0))
    assert stats.steps == 0 and math.isnan(stats.loss)
    assert math.isfinite(loop.worker.train(0, loop.server["global"], 0, FitSpec(epochs=1)).loss)


def test_a_fits_loss_is_the_in_order_float32_mean_of_its_last_epochs_batch_losses():
    # float32 in order: 1e8 + 1 rounds back to 1e8, so the sum is 1 (a float64 sum would give 2)
    losses = [torch.tensor(v) for v in (1e8, 1.0, -1e8, 1.0)]
    assert mean_of(losses) == 0.25
    assert mean_of([torch.tensor(1.5, dtype=torch.bfloat16), torch.tensor(2.0)]) == 1.75
    stats = FitStats(4, 4, 4, losses, 0.0)  # kept as tensors until read, then the float
    assert stats.loss == 0.25 and stats.loss == 0.25
    loop = make_loop(tiny_config("fedavg"))
    fit = loop.worker.train(0, loop.server["global"], 0, FitSpec(epochs=2))
    last = [loss.item() for loss in fit._loss]  # the last epoch's batch losses, before the read
    assert len(last) == fit.steps // 2 and fit.loss == pytest.approx(sum(last) / len(last), rel=1e-6)
