"""Tests of pfl/methods/fedpg.py."""

from __future__ import annotations

import math
import types

import pytest
import torch

from pfl.engine.flat import ModelLayout
from pfl.errors import ConfigError
from pfl.methods import ServerContext, Upload
from pfl.methods import costs as costs_module
from pfl.methods import fedpg as fedpg_module
from pfl.methods.fedpg import FedPG, SFedPG
from pfl.metrics.comm import nbytes
from pfl.optim.descent import fairness_gradient, fairness_value
from tests.conftest import make_loop, tiny_config
from tests.helpers.device_tags import is_on_device, training_device
from tests.methods.helpers import bare_server, exchanged_round

TOL = 1e-9


def uploads_for(w: torch.Tensor, grads: dict[int, torch.Tensor], losses: dict[int, float]) -> dict[int, Upload]:
    """What FedPG clients upload: the trained model w − g_i and the loss L_i(w)."""
    return {c: Upload(w - g, 1.0, {"loss": torch.tensor([losses[c]], dtype=w.dtype)}) for c, g in grads.items()}


def random_round(gen: torch.Generator, cids: list[int], p: int) -> tuple[dict, dict]:
    shared = torch.randn(p, generator=gen, dtype=torch.float64)
    grads = {c: torch.randn(p, generator=gen, dtype=torch.float64) + 0.3 * shared for c in cids}
    losses = {c: 1.0 + float(torch.rand(1, generator=gen, dtype=torch.float64)) for c in cids}
    return grads, losses


# -- FedPG's G-model step ---------------------------------------------------------------------------
@pytest.mark.parametrize("rescale", ["none", "mean", "median"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_applied_step_descends_for_every_sampled_and_history_client_and_for_fairness(rescale, seed):
    gen = torch.Generator().manual_seed(seed)
    p = 12
    method = FedPG(server_lr=0.7, rescale=rescale)
    server = bare_server(method, p)
    for cids in ([0, 1, 2, 3], [2, 4, 5], [0, 6, 7, 1, 3]):  # partial participation: history rows appear
        w = server["global"].clone()
        grads, losses = random_round(gen, cids, p)
        history = {c: g.clone() for c, g in server["history"].items() if c not in grads}
        method.aggregate(server, uploads_for(w, grads, losses))
        step = server["global"] - w
        assert float(step.norm()) > 1e-6  # these rounds are not Pareto stationary
        for g in [*grads.values(), *history.values()]:
            assert float(g @ step) <= TOL * float(g.norm() * step.norm())
        stacked = torch.stack([grads[c] for c in sorted(grads)])
        grad_f = fairness_gradient(torch.tensor([losses[c] for c in sorted(grads)]), stacked)
        assert float(grad_f @ step) <= TOL * float(grad_f.norm() * step.norm())
        assert server["stats"]["history_rows"] == len(history) and server["stats"]["conflicts"] == 0
        assert set(server["history"]) >= set(cids)
        for c in cids:  # the stored gradient of a client that took part is this round's
            torch.testing.assert_close(server["history"][c], grads[c], rtol=0, atol=1e-14)


def test_history_false_keeps_no_gradient_and_ignores_absent_clients():
    gen = torch.Generator().manual_seed(3)
    method = FedPG(history=False)
    server = bare_server(method, 6)
    for cids in ([0, 1], [2, 3]):
        grads, losses = random_round(gen, cids, 6)
        method.aggregate(server, uploads_for(server["global"].clone(), grads, losses))
        assert server["history"] == {} and server["stats"]["history_rows"] == 0


@pytest.mark.parametrize("cls", [FedPG, SFedPG])
def test_default_rescales_to_the_median_and_keeps_history_forever(cls):
    method = cls()
    assert (method.rescale, method.history_max_age) == ("median", None)


def test_history_max_age_drops_gradients_older_than_the_age_and_none_keeps_them():
    """Client 0 takes part in round 1 only; with max age 2 its row is in Q at rounds 2 and 3 (ages 1,
    2) and gone from round 4 on; without a max age it stays."""
    gen = torch.Generator().manual_seed(5)
    rows = {}
    for age in (None, 2):
        method = FedPG(history_max_age=age)
        server = bare_server(method, 6)
        seen = []
        for r, cids in enumerate(([1, 2], [0, 1], [1, 2], [1, 2], [1, 2], [1, 2])):
            server.round = r
            grads, losses = random_round(gen, cids, 6)
            method.aggregate(server, uploads_for(server["global"].clone(), grads, losses))
            seen.append((server["stats"]["history_rows"], 0 in server["history"]))
        rows[age] = seen
    assert rows[None] == [(0, False), (1, True), (1, True), (1, True), (1, True), (1, True)]
    assert rows[2] == [(0, False), (1, True), (1, True), (1, True), (0, False), (0, False)]


def test_lambda_lies_on_the_simplex():
    gen = torch.Generator().manual_seed(4)
    method = FedPG(rescale="mean")
    server = bare_server(method, 9)
    for cids in ([0, 1, 2], [3, 4], [1, 5, 6, 7]):
        grads, losses = random_round(gen, cids, 9)
        method.aggregate(server, uploads_for(server["global"].clone(), grads, losses))
        lam = server["lambda"]
        assert bool((lam >= 0).all()) and abs(float(lam.sum()) - 1.0) < 1e-9
        assert lam.numel() == len(cids) + 1 + server["stats"]["history_rows"]


def test_nearly_equal_losses_stall_the_unscaled_step_and_rescaling_restores_it():
    """∇F = Σ h_i g_i with h ∝ the spread of the losses: when the losses are nearly equal (as at the
    start of training) ∇F is a short row near the origin and the min-norm d shrinks to it; rescaled to
    the clients' mean (authors' partial code) or median (pfl's default) gradient norm it constrains d
    without shrinking it."""
    gen = torch.Generator().manual_seed(12)
    grads, _ = random_round(gen, [0, 1, 2], 8)
    losses = {0: 2.30, 1: 2.31, 2: 2.30}
    norms = {}
    for rescale in ("none", "mean", "median"):
        method = FedPG(rescale=rescale)
        server = bare_server(method, 8)
        method.aggregate(server, uploads_for(server["global"].clone(), grads, losses))
        norms[rescale] = server["stats"]["d_norm"]
        assert server["stats"]["lambda_fairness"] > 0
    assert norms["none"] < 0.05 * min(norms["mean"], norms["median"])


def test_two_opposite_clients_give_no_move():
    g = torch.linspace(-1.0, 2.0, 7, dtype=torch.float64)
    for fairness in (True, False):
        method = FedPG(fairness=fairness)
        server = bare_server(method, 7)
        w = torch.linspace(0.5, 1.5, 7, dtype=torch.float64)
        server["global"] = w.clone()
        method.aggregate(server, uploads_for(w, {0: g, 1: -g}, {0: 1.3, 1: 0.4}))
        assert float((server["global"] - w).norm()) <= 1e-10 * float(g.norm())


def test_with_one_client_fedpg_is_gradient_descent():
    """L(w) = ½‖A w − b‖², g = ∇L; five FedPG rounds with a single client are GD with η_t = η·decay^t."""
    gen = torch.Generator().manual_seed(5)
    a = torch.randn(8, 5, generator=gen, dtype=torch.float64)
    b = torch.randn(8, generator=gen, dtype=torch.float64)
    method = FedPG(server_lr=0.05, lr_decay=0.9)
    server = bare_server(method, 5, num_clients=1)
    w_gd = server["global"].clone()
    for t in range(5):
        server.round = t
        w = server["global"].clone()
        g = a.T @ (a @ w - b)
        method.aggregate(server, uploads_for(w, {0: g}, {0: float(0.5 * (a @ w - b).pow(2).sum())}))
        w_gd = w_gd - 0.05 * 0.9**t * (a.T @ (a @ w_gd - b))
        torch.testing.assert_close(server["global"], w_gd, rtol=0, atol=1e-12)


def test_one_sampled_client_in_the_loop_gives_its_trained_model():
    """η = 1 and no history: w ← w − (w − w_1) = w_1, FedAvg with one client."""
    loop = make_loop(tiny_config("fedpg", {"history": False}, trainer={"clients_per_round": 1}))
    for _ in range(2):
        _, results = exchanged_round(loop)
        (upload,) = results.values()
        torch.testing.assert_close(loop.server["global"], upload.state, rtol=0, atol=1e-6)


def test_clients_upload_their_train_loss_at_the_received_model():
    loop = make_loop(tiny_config("fedpg"))
    payloads, results = exchanged_round(loop)
    for cid, r in results.items():
        expected = loop.client(cid).evaluate(payloads[cid]["global"], "train").loss
        assert float(r["loss"]) == pytest.approx(expected, rel=1e-6)
        assert nbytes(r) == r.state.numel() * 4 + 4  # the model and one number


# -- P-models ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("gamma", [0.3, 0.6, 1.0])
def test_stored_personal_directions_never_conflict_with_another_clients_gradient(gamma):
    gen = torch.Generator().manual_seed(6)
    p = 10
    method = FedPG(gamma=gamma, rescale="mean")
    server = bare_server(method, p)
    for cids in ([0, 1, 2, 3], [1, 4, 5]):
        w = server["global"].clone()
        grads, losses = random_round(gen, cids, p)
        history = {c: g.clone() for c, g in server["history"].items() if c not in grads}
        method.aggregate(server, uploads_for(w, grads, losses))
        eta = server["stats"]["step"]
        rows = {**grads, **history}
        for i in cids:
            d_i = (server["personal"][i] - w) / eta
            assert float(d_i.norm()) > 0
            for j, g in rows.items():
                assert float(g @ d_i) <= TOL * float(g.norm() * d_i.norm()), (i, j)
    assert set(server["personal"]) == {0, 1, 2, 3, 4, 5}


def test_personal_directions_on_real_clients_in_the_loop():
    """The same property on the models a real round trains (pseudo-gradients of an MLP), history included."""
    loop = make_loop(tiny_config("fedpg", {"gamma": 0.6, "rescale": "mean"}, trainer={"fraction": 0.5}))
    p = loop.server.layout.num_params
    for _ in range(3):
        w = loop.server["global"].clone()
        history = {c: g.clone() for c, g in loop.server["history"].items()}
        _, results = exchanged_round(loop)
        eta = loop.server["stats"]["step"]
        rows = {c: (w[:p] - r.state[:p]).double() for c, r in results.items()}
        rows.update({c: g.double() for c, g in history.items() if c not in results})
        for i in results:
            d_i = ((loop.server["personal"][i][:p] - w[:p]) / eta).double()
            for j, g in rows.items():
                if j != i:  # float32 vectors: the bound is relative to ‖g‖‖d_i‖
                    assert float(g @ d_i) <= 1e-5 * float(g.norm() * d_i.norm()), (i, j)
            assert torch.equal(loop.method.personal_state(loop.server, loop.client(i)), loop.server["personal"][i])


def test_gamma_zero_personal_model_is_the_global_model():
    loop = make_loop(tiny_config("fedpg"))
    exchanged_round(loop)
    assert "personal" not in loop.server.state
    assert loop.method.personal_state(loop.server, loop.client(0)) is loop.server["global"]


def test_personal_directions_are_counted_as_downloads():
    loop = make_loop(tiny_config("fedpg", {"gamma": 0.3}, trainer={"fraction": 0.5}))
    loop.run_round()
    m = len(loop.server["personal"])
    p = loop.server.layout.num_params
    assert loop.evals.comm.down == m * loop.server["global"].numel() * 4 + m * p * 4  # payloads + d_i


# -- S-FedPG line search -----------------------------------------------------------------------------
def quadratic_problem(seed: int, m: int, p: int):
    """L_i(w) = ½‖w − c_i‖²: g_i = w − c_i and a client trained to its minimum uploads c_i."""
    gen = torch.Generator().manual_seed(seed)
    centers = {c: torch.randn(p, generator=gen, dtype=torch.float64) + 2.0 for c in range(m)}

    def loss(c: int, state: torch.Tensor) -> float:
        return float(0.5 * (state - centers[c]).pow(2).sum())

    return centers, loss


def test_line_search_returns_an_armijo_step_and_counts_its_trials():
    m, p, beta = 3, 6, 0.25
    centers, loss = quadratic_problem(7, m, p)
    method = SFedPG(server_lr=2.0, s=2, beta=beta, sigma=1.0)  # candidates 8, 4, 2, 1, 0.5
    server = bare_server(method, p, num_clients=m)
    server.client_loss = loss
    w = server["global"].clone()
    grads = {c: w - centers[c] for c in range(m)}
    losses = {c: loss(c, w) for c in range(m)}
    method.aggregate(server, uploads_for(w, grads, losses))
    stats = server["stats"]
    eta, trials = stats["step"], stats["trials"]
    d = (server["global"] - w) / eta
    l0 = torch.tensor([losses[c] for c in range(m)])

    def armijo(step: float) -> bool:
        new = torch.tensor([loss(c, w + step * d) for c in range(m)])
        slopes = torch.tensor([float(grads[c] @ d) for c in range(m)])
        g_f = fairness_gradient(l0, torch.stack([grads[c] for c in range(m)]))
        clients = bool((new <= l0 + beta * step * slopes).all())
        return clients and fairness_value(new) <= fairness_value(l0) + beta * step * float(g_f @ d)

    candidates = [8.0, 4.0, 2.0, 1.0, 0.5]
    assert stats["rule"] == 0 and armijo(eta)  # rule 0: Armijo held
    assert trials == candidates.index(eta) + 1 and trials >= 2  # the larger trials were tried and failed
    assert all(not armijo(c) for c in candidates[: trials - 1])
    up, down = method.comm_extra(server)
    assert up == m * trials * 4  # one loss per client per trial
    assert down == m * (p * 8 + trials * 4)  # d once (float64 here), then η per trial
    assert method.comm_extra(server) == (0, 0)  # reported once


def test_line_search_checks_the_fairness_condition():
    """Both clients' losses fall at every trial step, but beyond 1.5‖d‖ client 0's falls so fast that the
    losses grow apart (F = −cos(L, 1) rises): the search must pass over η = 4 and 2 and take η = 1."""
    p, steps = 5, [4.0, 2.0, 1.0, 0.5, 0.25]
    gen = torch.Generator().manual_seed(11)
    base = {c: torch.randn(p, generator=gen, dtype=torch.float64) for c in (0, 1)}

    def run(grads, oracle):
        method = SFedPG(server_lr=1.0, s=2, beta=1e-4)
        server = bare_server(method, p, num_clients=2)
        server.client_loss = oracle
        w = server["global"].clone()
        method.aggregate(server, uploads_for(w, grads, {0: 1.0, 1: 2.0}))
        return server

    probe = run(base, lambda cid, state: 1.0 + cid)  # flat losses: only to read ‖d‖
    grads = {c: g * 0.2 / probe["stats"]["d_norm"] for c, g in base.items()}  # now ‖d‖ = 0.2
    x = 0.2

    def oracle(cid: int, state: torch.Tensor) -> float:
        s = float(state.norm())  # w = 0: the distance moved, η‖d‖
        return 1.0 - 0.1 * s - 0.5 * max(0.0, s - 1.5 * x) if cid == 0 else 2.0 - 0.3 * s

    server = run(grads, oracle)
    assert server["stats"]["step"] == 1.0 and server["stats"]["rule"] == 0 and server["stats"]["trials"] == 3
    assert steps.index(server["stats"]["step"]) == 2


def test_line_search_trials_reach_the_communication_metrics_in_the_loop():
    loop = make_loop(tiny_config("sfedpg", trainer={"fraction": 0.5}))
    loop.run_round()
    trials = loop.server["stats"]["trials"]
    m = len(loop.sampled_clients())
    size = loop.server["global"].numel()
    assert trials >= 1
    assert loop.evals.comm.up == m * (size * 4 + 4) + m * trials * 4
    assert loop.evals.comm.down == m * size * 4 + m * (loop.server.layout.num_params * 4 + trials * 4)


def test_absent_previous_client_caps_the_first_trial():
    p = 4
    centers, loss = quadratic_problem(8, 3, p)
    method = SFedPG(server_lr=1.0, s=1)
    server = bare_server(method, p, num_clients=3)
    server.client_loss = loss
    for cids in ([0, 1], [1, 2]):  # client 0 of the previous round is absent in the second
        w = server["global"].clone()
        grads = {c: w - centers[c] for c in cids}
        method.aggregate(server, uploads_for(w, grads, {c: loss(c, w) for c in cids}))
    assert server["stats"]["step"] <= 1.0  # η_ub = η, not 2η


# -- configuration -----------------------------------------------------------------------------------------
def test_attack_and_decay_options_parse_and_bad_values_are_refused():
    from pfl.runner.args import parse_fit_args

    base = ["--method.name", "fedpg", "--tracking.wandb", "false"]
    cfg = parse_fit_args([*base, "--attack.kind", "scale", "--attack.fraction", "0.1", "--client.lr_decay", "0.999"])[0]
    assert cfg.attack.kind == "scale" and cfg.attack.magnitude == 100.0 and cfg.client.lr_decay == 0.999
    for bad in (["--attack.kind", "flip"], ["--attack.fraction", "1.0"], ["--client.lr_decay", "1.5"]):
        with pytest.raises(ConfigError):
            parse_fit_args([*base, *bad])
    for field, value in (("gamma", 1.5), ("server_lr", 0.0), ("lr_decay", 0.0)):
        with pytest.raises(ConfigError, match=f"method.{field}"):
            FedPG(**{field: value})


# -- FedPG's bookkeeping: bounds, stats, timings, counters, the conflict check ---------------------------
def test_fedpg_and_sfedpg_bounds_accept_their_edges_and_refuse_past_them():
    FedPG(personal_lr=0.5), FedPG(lr_decay=1.0), SFedPG(s=0), SFedPG(beta=0.5, sigma=1e-3), FedPG(history_max_age=1)
    for bad, field in (
        ({"server_lr": math.inf}, "method.server_lr"),
        ({"lr_decay": 1.5}, "method.lr_decay"),
        ({"personal_lr": 0.0}, "method.personal_lr"),
        ({"rescale": True}, "method.rescale: unknown value True"),
        ({"rescale": "max"}, "method.rescale: unknown value 'max'"),
        ({"history_max_age": 0}, "method.history_max_age"),
        ({"history_max_age": 1.5}, "method.history_max_age"),
    ):
        with pytest.raises(ConfigError, match=field):
            FedPG(**bad)
    for bad, field in (
        ({"s": -1}, "method.s"),
        ({"s": 1.5}, "method.s"),
        ({"beta": 0.0}, "method.beta"),
        ({"beta": 1.0}, "method.beta"),
        ({"sigma": 0.0}, "method.sigma"),
        ({"sigma": math.inf}, "method.sigma"),
    ):
        with pytest.raises(ConfigError, match=field):
            SFedPG(**bad)


def test_count_conflicts_uses_the_relative_tolerance_strictly():
    rows = torch.full((3, 4), 1.0, dtype=torch.float64)  # ‖q‖ = 2 each; ‖d‖ = 0.5: the bound is 1e-7
    slopes = torch.tensor([2e-7, 5e-8, 1e-7], dtype=torch.float64)
    assert fedpg_module.count_conflicts(slopes, [rows, None], 0.25) == 1  # above the bound only; equal is no conflict


def test_round_stats_count_dropped_clients_and_split_lambda_by_row_kind():
    p = 6
    gen = torch.Generator().manual_seed(3)
    for fairness in (True, False):
        method = FedPG(fairness=fairness, history=False)
        server = bare_server(method, p)
        w = server["global"].clone()
        grads, _ = random_round(gen, [0, 1, 2], p)
        method.aggregate(server, uploads_for(w, grads, {0: 0.2, 1: 0.3, 2: 0.1}))  # ‖L‖ < 1
        stats, lam = server["stats"], server["lambda"]
        assert stats["dropped_nonfinite"] == 0 and len(lam) == 3 + int(fairness)
        assert stats["lambda_history"] == 0.0 and stats["lambda_clients"] == pytest.approx(float(lam[:3].sum()))
        assert stats["lambda_fairness"] == (pytest.approx(float(lam[3])) if fairness else 0.0)
    method = FedPG()
    server = bare_server(method, p)
    grads, _ = random_round(gen, [0, 1, 2], p)
    method.aggregate(server, uploads_for(server["global"].clone(), grads, {0: 0.0, 1: 0.0, 2: 0.0}))
    assert len(server["lambda"]) == 3  # zero losses: cos(L, 1) is undefined, no fairness row
    bad = uploads_for(server["global"].clone(), grads, {0: 1.0, 1: 2.0, 2: 1.5})
    bad[1] = Upload(torch.full((p,), math.nan, dtype=torch.float64), 1.0, bad[1].extras)
    method.aggregate(server, bad)
    assert server["stats"]["dropped_nonfinite"] == 1


def test_timings_are_per_round_means_reset_at_each_report(monkeypatch):
    clock = iter(range(10_000))
    monkeypatch.setattr(costs_module, "time", types.SimpleNamespace(perf_counter=lambda: float(next(clock))))
    for cls, searches in ((FedPG, False), (SFedPG, True)):
        method = cls()
        server = bare_server(method, 4, num_clients=2)
        server.client_loss = lambda cid, state: 1.0
        gen = torch.Generator().manual_seed(0)
        for _report in range(2):
            for r in range(2):  # two rounds per report: each takes 1 + 1 clock ticks to solve, 1 to search
                server.round = r
                grads, losses = random_round(gen, [0, 1], 4)
                method.aggregate(server, uploads_for(server["global"].clone(), grads, losses))
            for _ in range(6):  # what the clients' local updates add (see local_update): 1 tick each
                with method.timed("client"):
                    pass
            out = method.metrics(server)
            assert out[f"time.{cls.name}.solve_s_per_round"] == 2.0
            assert out[f"time.{cls.name}.client_s_per_round"] == 3.0
            assert (f"time.{cls.name}.search_s_per_round" in out) == searches
            if searches:
                assert out[f"time.{cls.name}.search_s_per_round"] == 1.0
        assert not any(k.startswith("time.") for k in method.metrics(server))  # nothing since the last report


def test_client_time_is_the_local_updates_wall_clock(monkeypatch):
    loop = make_loop(tiny_config("fedpg", trainer={"fraction": 0.5}))
    clock = iter(range(5, 10_000))
    monkeypatch.setattr(costs_module, "time", types.SimpleNamespace(perf_counter=lambda: 10.0 * next(clock)))
    for cid in (0, 1):
        loop.method.local_update(loop.client(cid), {"global": loop.server["global"]})
    times = loop.method.take_times(loop.server)
    assert times.seconds == {"client": 20.0} and times.counts == {"client": 2}  # 10 per local update, summed


def test_personal_directions_count_downloads_only():
    method = FedPG(gamma=0.5)
    server = bare_server(method, 5, num_clients=3)
    grads, losses = random_round(torch.Generator().manual_seed(1), [0, 1, 2], 5)
    method.aggregate(server, uploads_for(server["global"].clone(), grads, losses))
    assert method.comm_extra(server) == (0, 3 * 5 * 8)  # d_i (float64 here) down to each client, nothing up
    for _ in range(2):  # two rounds between reports: the counts add up, each in its own direction
        method.aggregate(server, uploads_for(server["global"].clone(), grads, losses))
    assert method.comm_extra(server) == (0, 2 * 3 * 5 * 8)


def test_sfedpg_counters_accumulate_from_zero_and_rules_are_numbered():
    m, p = 3, 6
    centers, loss = quadratic_problem(7, m, p)
    method = SFedPG(server_lr=2.0, s=2, beta=0.25)
    server = bare_server(method, p, num_clients=m)
    assert server["trials_total"] == 0 and server["armijo_rounds"] == 0
    server.client_loss = loss
    totals, armijo = 0, 0
    for _ in range(3):
        w = server["global"].clone()
        method.aggregate(
            server, uploads_for(w, {c: w - centers[c] for c in range(m)}, {c: loss(c, w) for c in range(m)})
        )
        stats = server["stats"]
        totals += stats["trials"]
        armijo += int(stats["rule"] == 0)
        assert stats["trials_total"] == totals == server["trials_total"]
        assert stats["armijo_rounds"] == armijo == server["armijo_rounds"]
    # a search where no trial satisfies Armijo falls back to the mean-loss rule (1) or the best seen (2)
    flat = SFedPG(server_lr=1.0, s=1)
    server = bare_server(flat, p, num_clients=2)
    server.client_loss = lambda cid, state: 5.0 + float(state.norm())  # every move raises the loss
    grads, losses = random_round(torch.Generator().manual_seed(2), [0, 1], p)
    flat.aggregate(server, uploads_for(server["global"].clone(), grads, {0: 5.0, 1: 5.0}))
    assert server["stats"]["rule"] == 2 and server["armijo_rounds"] == 0  # best_seen: no trial lowered the mean
    mixed = SFedPG(server_lr=1.0, s=1)
    server = bare_server(mixed, p, num_clients=2)
    server.client_loss = lambda cid, state: 5.0 + (0.1 if cid else -1.0) * float(state.norm())  # client 1 rises
    mixed.aggregate(server, uploads_for(server["global"].clone(), grads, {0: 5.0, 1: 5.0}))
    assert server["stats"]["rule"] == 1  # mean_loss: the mean fell, Armijo failed for client 1


def test_previous_clients_all_present_when_this_round_repeats_them(monkeypatch):
    p = 4
    centers, loss = quadratic_problem(8, 3, p)
    seen = []
    real = fedpg_module.armijo_line_search

    def spy(*args, **kwargs):
        seen.append(kwargs["prev_all_present"])
        return real(*args, **kwargs)

    monkeypatch.setattr(fedpg_module, "armijo_line_search", spy)
    method = SFedPG(server_lr=1.0, s=1)
    server = bare_server(method, p, num_clients=3)
    server.client_loss = loss
    for cids in ([0, 1], [0, 1], [1, 2]):  # the same set again: all present (not a strict superset)
        w = server["global"].clone()
        method.aggregate(server, uploads_for(w, {c: w - centers[c] for c in cids}, {c: loss(c, w) for c in cids}))
    assert seen == [True, True, False]


def test_a_round_of_only_diverged_uploads_leaves_the_model_and_reports_the_drop():
    method = FedPG()
    server = bare_server(method, 4, num_clients=2)
    before = server["global"].clone()
    nan = torch.full((4,), math.nan, dtype=torch.float64)
    method.aggregate(server, {c: Upload(nan, 1.0, {"loss": torch.tensor([1.0], dtype=torch.float64)}) for c in (0, 1)})
    assert server["stats"] == {"dropped_nonfinite": 2} and torch.equal(server["global"], before)


@pytest.mark.parametrize("cls", [FedPG, SFedPG])
def test_buffers_are_the_weighted_mean_of_the_uploads_and_the_search_evaluates_with_them(cls):
    p, b = 4, 2
    layout = ModelLayout(p, b, (("0", slice(0, p)),), torch.device("cpu"))
    method = cls()
    server = ServerContext(0, 2, 2, layout, torch.zeros(p + b, dtype=torch.float64))
    server.state = method.init_server(server)
    asked = []
    server.client_loss = lambda cid, state: asked.append(state[p:].clone()) or 1.0
    grads, losses = random_round(torch.Generator().manual_seed(4), [0, 1], p)
    uploads = {
        c: Upload(
            torch.cat([-grads[c], torch.full((b,), 1.0 + c, dtype=torch.float64)]),
            1.0 + 2 * c,
            {"loss": torch.tensor([losses[c]], dtype=torch.float64)},
        )
        for c in (0, 1)
    }
    method.aggregate(server, uploads)
    mean = (1.0 * 1.0 + 3.0 * 2.0) / 4.0
    assert torch.equal(server["global"][p:], torch.full((b,), mean, dtype=torch.float64))
    assert all(torch.equal(a, torch.full((b,), mean, dtype=torch.float64)) for a in asked) and (
        bool(asked) == (cls is SFedPG)
    )


# -- the defaults train ---------------------------------------------------------------------------------
def default_like(method: str, method_args: dict | None = None, rounds: int = 20):
    """conf/default.yaml (digits, 20 Dirichlet-0.5 clients, half online, 5 epochs, MLP 128-128), shorter."""
    return tiny_config(
        method,
        method_args,
        trainer={"rounds": rounds, "eval_every": rounds, "fraction": 0.5, "progress": False},
        client={"epochs": 5, "batch_size": 32, "lr": 0.1},
        data={"num_clients": 20},
        model={"hidden": [128, 128]},
    )


@pytest.mark.parametrize("name", ["fedpg", "sfedpg"])
def test_the_default_trains_well_above_chance_where_the_printed_q_stalls(name):
    """Ten classes: chance is 0.1. The default (median rescaling) learns; Q as printed does not move
    (∇F ≈ 0 at the nearly equal initial losses, so d ≈ 0)."""
    trained = make_loop(default_like(name, rounds=20)).fit()["metrics"]  # 0.66 / 0.62 measured
    assert trained["pm.l_acc.mean"] > 0.5 and trained["gm.acc"] > 0.5
    stalled = make_loop(default_like(name, {"rescale": "none"}, rounds=5)).fit()["metrics"]
    assert stalled["gm.acc"] < 0.2 and stalled[f"{name}.d_norm"] < 0.01 * trained[f"{name}.d_norm"]


def test_fedpg_refuses_an_unknown_solver_or_rescale_with_the_choices():
    for cls in (FedPG, SFedPG):
        for field, allowed in (("solver", "auto, cvxopt, frank_wolfe, pgd"), ("rescale", "none, mean, median")):
            with pytest.raises(ConfigError) as err:
                cls(**{field: "zzz"})  # close to none of them: the choices are listed
            assert str(err.value) == f"method.{field}: unknown value 'zzz' (choose one of {allowed})"


@pytest.mark.parametrize("cls", [FedPG, SFedPG])
def test_the_server_step_keeps_to_the_training_device(cls):
    """The server's model, the uploads and their losses on the training device (a CUDA run), the
    clients' trial losses answered as numbers: the solve, the search and the step mix no host tensor in."""
    p, m = 6, 3
    with training_device() as dev:
        layout = ModelLayout(p, 0, (("0", slice(0, p)),), dev)
        method = cls(gamma=0.3)
        server = ServerContext(0, m, m, layout, torch.zeros(p, dtype=torch.float64, device=dev))
        server.state = method.init_server(server)
        centers = {c: v.to(dev) for c, v in quadratic_problem(3, m, p)[0].items()}
        server.client_loss = lambda c, state: float(0.5 * (state - centers[c]).pow(2).sum())
        w = server["global"].clone()
        losses = {c: torch.tensor([server.client_loss(c, w)], dtype=torch.float64, device=dev) for c in range(m)}
        method.aggregate(server, {c: Upload(centers[c], 1.0, {"loss": losses[c]}) for c in range(m)})
        assert is_on_device(server["global"]) and all(is_on_device(v) for v in server["personal"].values())
        assert float((server["global"] - w).norm()) > 0 and server["stats"]["conflicts"] == 0
