"""Properties only a correct federated loop has."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

import pfl.federation.loop as loop_module
from pfl.federation.loop import Callback, comparable_metrics, sample_clients
from pfl.models import build_model
from pfl.seeding import seed_everything, torch_generator
from tests.conftest import make_loop, tiny_config


def test_fedprox_mu_zero_equals_fedavg():
    a = make_loop(tiny_config("fedavg"))
    b = make_loop(tiny_config("fedprox", {"mu": 0.0}))
    a.fit(), b.fit()
    assert torch.equal(a.server["global"], b.server["global"])


def test_fedprox_mu_positive_differs_and_stays_closer():
    a = make_loop(tiny_config("fedavg"))
    b = make_loop(tiny_config("fedprox", {"mu": 5.0}))
    a.fit(), b.fit()
    init = a.init_state
    assert (b.server["global"] - init).norm() < (a.server["global"] - init).norm()


def test_fedavg_one_client_equals_plain_sgd():
    cfg = tiny_config("fedavg", data={"num_clients": 1, "min_samples": 1}, client={"epochs": 2, "batch_size": 16})
    loop = make_loop(cfg)
    loop.fit()
    # Plain PyTorch: same init, same batches, one SGD optimizer carried over the whole run.
    seed_everything(cfg.seed, "init")
    net = build_model(cfg.model, loop.worker.data.input_shape, loop.worker.data.num_classes)
    opt = torch.optim.SGD(net.parameters(), lr=cfg.client.lr)
    data = loop.worker.data
    idx = data.clients[0].train
    for r in range(cfg.trainer.rounds):
        gen = torch_generator(cfg.seed, r, 0, "train", "batches")
        for _ in range(cfg.client.epochs):
            order = idx[torch.randperm(len(idx), generator=gen)]
            for s in range(0, len(idx), cfg.client.batch_size):
                b = order[s : s + cfg.client.batch_size]
                opt.zero_grad()
                F.cross_entropy(net(data.x[b]), data.y[b]).backward()
                opt.step()
    expected = torch.cat([p.detach().reshape(-1) for p in net.parameters()])
    torch.testing.assert_close(loop.server["global"], expected, rtol=1e-5, atol=1e-6)


def test_ditto_huge_lambda_pins_personal_to_global():
    loop = make_loop(tiny_config("ditto", {"lam": 1e9, "prox": "exact"}))  # the exact step: stable for any λ
    for _ in range(2):
        received = loop.server["global"].clone()
        loop.run_round()
    for cid in range(loop.worker.data.num_clients):
        torch.testing.assert_close(loop.clients[cid]["personal"], received, rtol=0, atol=1e-6)
    # and a small λ really personalizes
    free = make_loop(tiny_config("ditto", {"lam": 0.0}))
    free.run_round()
    assert (free.clients[0]["personal"] - free.init_state).abs().max() > 1e-3


def test_ditto_gradient_mode_matches_exact_mode_for_small_lambda():
    exact = make_loop(tiny_config("ditto", {"lam": 1e-3, "prox": "exact"}))
    grad = make_loop(tiny_config("ditto", {"lam": 1e-3, "prox": "gradient"}))
    exact.run_round(), grad.run_round()
    torch.testing.assert_close(exact.clients[0]["personal"], grad.clients[0]["personal"], rtol=0, atol=1e-4)


def test_round_does_not_depend_on_client_order(monkeypatch):
    cfg = tiny_config("fedavg", trainer={"fraction": 0.5})
    a = make_loop(cfg)
    a.run_round()
    import pfl.federation.loop as loop_mod

    original = loop_mod.sample_clients
    monkeypatch.setattr(loop_mod, "sample_clients", lambda *args: original(*args)[::-1].copy())
    b = make_loop(cfg)
    b.run_round()
    assert torch.equal(a.server["global"], b.server["global"])


def test_training_a_client_does_not_move_the_server_model():
    loop = make_loop(tiny_config("fedavg"))
    before = loop.server["global"].clone()
    ctx = loop.client(0)
    loop.method.local_update(ctx, loop.method.payload(loop.server, 0))
    assert torch.equal(loop.server["global"], before)


def test_sampling_is_seeded_and_sized():
    a = sample_clients(0, 3, 100, 10)
    assert len(a) == 10 and len(set(a.tolist())) == 10
    assert np.array_equal(a, sample_clients(0, 3, 100, 10))
    assert not np.array_equal(a, sample_clients(0, 4, 100, 10))
    assert np.array_equal(sample_clients(0, 0, 5, 5), np.arange(5))


def test_fedavg_keeps_no_per_client_state():
    loop = make_loop(tiny_config("fedavg"))
    loop.fit()
    assert loop.clients == {}


def test_same_seed_same_metrics_and_other_seed_differs():
    s1 = make_loop(tiny_config("ditto")).fit()
    s2 = make_loop(tiny_config("ditto")).fit()
    s3 = make_loop(tiny_config("ditto", seed=1)).fit()
    assert comparable_metrics(s1) == comparable_metrics(s2)
    assert comparable_metrics(s1) != comparable_metrics(s3)


def test_local_learns_and_has_no_global_model():
    summary = make_loop(tiny_config("local", trainer={"rounds": 5})).fit()
    assert "gm.acc" not in summary["metrics"]
    assert summary["metrics"]["pm.l_acc.mean"] > 0.5


def test_fedavg_finetune_changes_personal_models_only():
    plain = make_loop(tiny_config("fedavg")).fit()
    ft = make_loop(tiny_config("fedavg", {"finetune_epochs": 2})).fit()
    assert plain["metrics"]["gm.acc"] == ft["metrics"]["gm.acc"]
    assert plain["metrics"]["pm.l_acc.mean"] == plain["metrics"]["gm.l_acc.mean"]
    assert ft["metrics"]["pm.l_acc.mean"] != ft["metrics"]["gm.l_acc.mean"]


class _Clock:
    """A perf_counter that moves only when told: the loop's timing is checked without timing anything."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now

    def after(self, seconds: float, step):
        def timed(*args, **kwargs):
            self.now += seconds
            return step(*args, **kwargs)

        return timed


class _Costs(Callback):
    def __init__(self, clock: _Clock):
        self.on_evaluation = clock.after(0.25, lambda loop, metrics: None)  # the outputs recording an evaluation
        self.on_round_end = clock.after(2.0, lambda loop: None)  # a checkpoint


def test_fit_times_its_rounds_and_its_evaluations_apart_and_only_those_it_runs(monkeypatch):
    clock = _Clock()
    monkeypatch.setattr(loop_module, "time", clock)
    loop = make_loop(tiny_config("fedavg", trainer={"rounds": 5, "eval_every": 2}))
    loop.run_round()  # done before this fit, as in a resumed run: not its time
    loop.run_round = clock.after(10.0, loop.run_round)
    loop.evaluate = clock.after(1.0, loop.evaluate)
    loop.callbacks.append(_Costs(clock))
    summary = loop.fit()
    # rounds 2..5, evaluated after 2, 4 and 5 (the last): each round 10 s + 2 s, each evaluation 1 s + 0.25 s
    assert summary["timing"] == {
        "rounds": 4, "rounds_s": 48.0, "first_round_s": 12.0, "evaluations": 3, "evaluations_s": 3.75}  # fmt: skip
    assert not any(k.startswith("timing") for k in summary["metrics"])  # a record of the machine, not a metric


def test_the_first_round_is_timed_apart_and_every_clock_read_waits_for_the_devices_work(monkeypatch):
    clock, waited = _Clock(), []
    monkeypatch.setattr(loop_module, "time", clock)
    monkeypatch.setattr(loop_module, "wait_for", waited.append)
    loop = make_loop(tiny_config("fedavg", trainer={"rounds": 3, "eval_every": 3}))
    rounds = iter([30.0, 10.0, 10.0])  # the first pays a compile
    run_round = loop.run_round
    loop.run_round = lambda: clock.after(next(rounds), run_round)()
    timing = loop.fit()["timing"]
    assert (timing["rounds"], timing["rounds_s"], timing["first_round_s"], timing["evaluations"]) == (3, 50.0, 30.0, 1)
    # each round's start and end, and the one evaluation's start and end
    assert waited == [loop.device] * 8
