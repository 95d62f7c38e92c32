"""Tests of pfl/methods/page.py."""

from __future__ import annotations

import io
import statistics

import pytest
import torch
import yaml

from pfl.errors import ConfigError
from pfl.methods.costs import Times
from pfl.methods.page import PAGE
from pfl.optim.ddpg import client_action_to_hparams, server_action_to_weights
from tests.conftest import make_loop, tiny_config
from tests.methods.helpers import (
    FAST_AGENTS,
    RANGE,
    VAL,
    assert_global_is_fedavgs,
    fixed_client_action,
    reference_round,
)
from tests.methods.helpers import REPO_ROOT as ROOT


def page_config(method_args: dict | None = None, **groups):
    """The tiny federation with validation splits, for PAGE."""
    return tiny_config("page", method_args, data={**VAL, **groups.pop("data", {})}, **groups)


class FixedPAGE(PAGE):
    """PAGE whose agents are replaced by fixed actions (they still store and learn from them)."""

    def client_action(self, agent, state, client):
        return fixed_client_action(client.cid)

    def server_action(self, agent, state, server):
        return torch.linspace(-0.5, 0.5, server.num_clients)


def test_page_with_fixed_actions_is_fedavg_with_those_learning_rates_epochs_and_weights():
    cfg = page_config(FAST_AGENTS)
    cfg.method = FixedPAGE(**FAST_AGENTS)
    loop, ref = make_loop(cfg), make_loop(tiny_config("fedavg", data=VAL))
    n = loop.server.num_clients
    hparams = [client_action_to_hparams(fixed_client_action(c), **RANGE) for c in range(n)]
    assert len({h for h in hparams}) > 2  # the clients really train differently
    weights = server_action_to_weights(torch.linspace(-0.5, 0.5, n).double()).tolist()
    g = loop.server["global"].clone()
    for _ in range(3):
        loop.run_round()
        g, trained = reference_round(ref, g, hparams, weights)
        assert torch.equal(loop.server["global"], g)
        for cid in range(n):
            assert torch.equal(loop.clients[cid]["personal"], trained[cid])  # the P-model is the trained one


def test_page_tuning_nothing_is_fedavg():
    loop = make_loop(tiny_config("page", {"tune": []}))
    assert_global_is_fedavgs(loop)
    assert "agent" not in loop.server.state and "agent" not in loop.clients[0]


def test_page_agents_choose_different_hparams_and_weights():
    loop = make_loop(page_config(FAST_AGENTS))
    loop.run_round()
    rows = loop.method._trained or loop.method._last_round
    assert len({(lr, e) for lr, e, _ in rows.values()}) > 1
    w = loop.server["weights"]
    assert abs(float(w.sum()) - 1) < 1e-6 and float(w.max() - w.min()) > 0


def _run_and_capture(loop):
    loop.run_round()
    clients = {cid: s["agent"]["buffer"]["actions"][-1].clone() for cid, s in loop.clients.items() if "agent" in s}
    return clients, loop.server["weights"].clone(), loop.server["global"].clone()


@pytest.mark.parametrize("lags", [(1, 0), (0, 1)])
def test_checkpoint_restore_takes_the_same_next_actions(lags):
    args = {**FAST_AGENTS, "client_lag": lags[0], "server_lag": lags[1]}
    loop = make_loop(page_config(args))
    for _ in range(5):  # past the warm-up: actions come from the actors, and the agents learn
        loop.run_round()
    assert loop.clients[0]["agent"]["learn_steps"] > 0 and loop.server["agent"]["learn_steps"] > 0
    buf = io.BytesIO()
    torch.save(loop.checkpointer.state_dict(), buf)
    buf.seek(0)
    saved = torch.load(buf, weights_only=True)
    fresh = make_loop(page_config(args))  # a new method object: nothing carried over in memory
    fresh.checkpointer.load_state_dict(saved)
    for _ in range(2):
        a_clients, a_weights, a_global = _run_and_capture(loop)
        b_clients, b_weights, b_global = _run_and_capture(fresh)
        assert a_clients.keys() == b_clients.keys()
        for cid in a_clients:
            assert torch.equal(a_clients[cid], b_clients[cid])
        assert torch.equal(a_weights, b_weights)
        assert torch.equal(a_global, b_global)


def test_biased_variants_change_only_the_reward_weighting():
    base = make_loop(page_config(FAST_AGENTS))
    biased = make_loop(page_config({**FAST_AGENTS, "server_reward_weight": 10.0, "client_reward_weight": 0.5}))
    for loop in (base, biased):
        loop.run_round()
    assert torch.equal(base.server["global"], biased.server["global"])  # same warm-up actions
    a, b = base.server["pending"], biased.server["pending"]  # server_lag 0: the transition awaits its next state
    assert torch.equal(a["state"], b["state"]) and torch.equal(a["action"], b["action"])
    assert abs(float(b["reward"]) / float(a["reward"]) - 10.0) < 1e-5
    for cid in base.clients:
        ra, rb = base.clients[cid]["agent"]["buffer"], biased.clients[cid]["agent"]["buffer"]
        assert torch.equal(ra["states"], rb["states"]) and torch.equal(ra["actions"], rb["actions"])
        assert torch.allclose(rb["rewards"], 0.5 * ra["rewards"], rtol=1e-6)
    # the configs of the paper's biased variants differ from PAGE's only in the two reward weights
    conf = {
        n: yaml.safe_load((ROOT / f"conf/method/{n}.yaml").read_text())["method"]
        for n in ("page", "page_10_1", "page_1_10")
    }
    weights = {"client_reward_weight", "server_reward_weight"}
    for variant in ("page_10_1", "page_1_10"):
        changed = {k for k in conf["page"].keys() | conf[variant].keys() if conf["page"].get(k) != conf[variant].get(k)}
        assert changed and changed <= weights
    assert conf["page_10_1"]["server_reward_weight"] / conf["page_10_1"]["client_reward_weight"] == 10
    assert conf["page_1_10"]["client_reward_weight"] / conf["page_1_10"]["server_reward_weight"] == 10


def test_page_needs_a_global_test_set():
    with pytest.raises(ConfigError, match="data.global_test_frac"):
        make_loop(tiny_config("page", {"reward_split": "test"}, data={"global_test_frac": 0.0}))


def test_page_reports_its_overhead_like_table_5():
    loop = make_loop(page_config(FAST_AGENTS, trainer={"rounds": 2}))
    metrics = loop.fit()["metrics"]
    for key in ("local_train_ms", "client_agent_ms", "aggregation_ms", "server_agent_ms", "agents_over_fl"):
        assert metrics[f"time.page.{key}"] > 0
    assert 0.01 <= metrics["page.lr.mean"] <= 0.1 and 1 <= metrics["page.epochs.mean"] <= 3


# -- PAGE's options at their bounds ----------------------------------------------------------------------
def test_page_reward_weights_and_penalty_must_be_positive():
    PAGE(client_reward_weight=1e-3, server_reward_weight=1e-3, penalty=1e-12)
    for field in ("client_reward_weight", "server_reward_weight", "penalty"):
        with pytest.raises(ConfigError, match=f"method.{field}"):
            PAGE(**{field: 0.0})


def test_page_rewards_are_the_weight_over_the_test_loss_plus_the_penalty():
    args = {**FAST_AGENTS, "client_reward_weight": 2.0, "server_reward_weight": 3.0, "penalty": 0.5}
    args["reward_split"] = "test"  # the paper's choice; validation (the default) is tested below
    cfg = page_config(args)
    cfg.method = FixedPAGE(**args)
    loop = make_loop(cfg)
    server = loop.server
    assert torch.equal(server["weights"], torch.full((server.num_clients,), 1.0 / server.num_clients))
    loop.run_round()
    assert float(server["reward"]) == pytest.approx(3.0 / (server.evaluate(server["global"]).loss + 0.5))
    assert loop.method._last_round  # (lr, epochs, reward) of the round's clients
    for cid, (_, _, reward) in loop.method._last_round.items():
        trained = loop.clients[cid]["personal"]
        assert reward == pytest.approx(2.0 / (loop.client(cid).evaluate(trained, "test").loss + 0.5))
    rows = list(loop.method._last_round.values())
    out = loop.method.metrics(server)
    assert out["page.lr.mean"] == pytest.approx(sum(r[0] for r in rows) / len(rows))
    assert out["page.epochs.mean"] == pytest.approx(sum(r[1] for r in rows) / len(rows))
    for i, name in ((0, "lr"), (1, "epochs")):
        std = statistics.pstdev(r[i] for r in rows)
        assert std > 0 and out[f"page.{name}.std"] == pytest.approx(std)
    assert out["page.client_reward.mean"] == pytest.approx(sum(r[2] for r in rows) / len(rows))
    assert out["page.server_reward"] == float(server["reward"]) and out["page.weight.max"] == float(
        server["weights"].max()
    )
    stored = server["pending"]["action"]
    assert torch.equal(stored, torch.linspace(-0.5, 0.5, server.num_clients))  # the agent's own action


def test_page_can_replay_the_weights_instead_of_the_action():
    args = {**FAST_AGENTS, "replay_actions": "mapped"}
    cfg = page_config(args)
    cfg.method = FixedPAGE(**args)
    loop = make_loop(cfg)
    loop.run_round()
    assert torch.equal(loop.server["pending"]["action"], loop.server["weights"])


class SilencedPAGE(FixedPAGE):
    """Weight 0 (action −1) for the even clients, the largest weight for the odd ones."""

    def server_action(self, agent, state, server):
        return torch.tensor([-1.0 if c % 2 == 0 else 1.0 for c in range(server.num_clients)])


def test_page_falls_back_to_equal_weights_when_the_sampled_clients_all_get_zero():
    cfg = page_config(FAST_AGENTS, trainer={"clients_per_round": 2})
    cfg.method = SilencedPAGE(**FAST_AGENTS)
    loop = make_loop(cfg)
    loop.sampled_clients = lambda: torch.tensor([0, 2]).numpy()  # both silenced
    loop.run_round()
    a, b = loop.clients[0]["personal"], loop.clients[2]["personal"]
    torch.testing.assert_close(loop.server["global"], 0.5 * a + 0.5 * b)


def test_page_learning_rate_errors_name_the_agent_they_belong_to():
    with pytest.raises(ConfigError, match="method.actor_lr"):
        PAGE(actor_lr=0.0)
    with pytest.raises(ConfigError, match="method.server_actor_lr"):
        PAGE(server_actor_lr=0.0)
    with pytest.raises(ConfigError, match="method.server_critic_lr"):
        PAGE(server_critic_lr=0.0)


def test_page_config_errors_read_as_the_methods_own_fields():
    with pytest.raises(ConfigError) as err:
        PAGE(actor_lr=0.0)
    assert str(err.value) == "method.actor_lr: must be > 0 (got 0.0)"
    with pytest.raises(ConfigError, match="method.tune"):
        PAGE(tune=["lr", "momentum"])
    assert PAGE(tune=["lr"]).tunes_client and PAGE(tune=["epochs"]).tunes_client
    assert not PAGE(tune=["weights"]).tunes_client and PAGE(tune=["weights"]).tunes_server


def fixed_times(method, seconds, counts):
    """Make ``method.take_times`` return these sums, as if its hooks had timed them."""
    method.take_times = lambda server: Times(dict(seconds), dict(counts), counts.get("aggregation", 0))


def test_page_reports_table_5s_split_per_round_and_per_client():
    method = PAGE()
    seconds = {"local_train": 2.0, "client_agent": 0.5, "aggregation": 0.5, "server_agent": 0.25}
    fixed_times(method, seconds, {"aggregation": 1, "local_train": 4})
    out = method.metrics(ServerContextStub())
    assert out["time.page.local_train_ms"] == 2000.0 and out["time.page.server_eval_ms"] == 0.0  # one round
    assert out["time.page.local_train_per_client_ms"] == 500.0 and out["time.page.client_agent_per_client_ms"] == 125.0
    assert out["time.page.agents_over_fl"] == pytest.approx(0.75 / 2.5)
    fixed_times(method, {"aggregation": 1.0, "local_train": 3.0}, {"aggregation": 2, "local_train": 1})
    out = method.metrics(ServerContextStub())  # two rounds, one local update, no agent timed
    assert out["time.page.aggregation_ms"] == 500.0 and out["time.page.local_train_per_client_ms"] == 3000.0
    assert out["time.page.client_agent_ms"] == 0.0 and out["time.page.agents_over_fl"] == 0.0
    fixed_times(method, {"aggregation": 1.0, "server_agent": 0.5}, {"aggregation": 1})  # no client
    assert method.metrics(ServerContextStub())["time.page.agents_over_fl"] == 0.5
    fixed_times(method, {"local_train": 1.0, "client_agent": 0.5}, {"local_train": 1})  # no aggregation
    assert method.metrics(ServerContextStub())["time.page.agents_over_fl"] == 0.5
    fixed_times(method, {}, {})  # nothing since the last report
    assert all(v == 0.0 for k, v in method.metrics(ServerContextStub()).items() if k.startswith("time."))


def test_page_times_every_phase_of_a_round_where_it_runs():
    cfg = page_config(FAST_AGENTS, trainer={"clients_per_round": 2})
    loop = make_loop(cfg)
    loop.run_round()
    times = loop.method.take_times(loop.server)
    server_side = {"server_eval": 2, "server_agent": 2, "aggregation": 1}  # two blocks each around the aggregation
    assert times.rounds == 1 and {k: times.counts[k] for k in server_side} == server_side
    assert {k: times.counts[k] for k in ("local_train", "client_eval", "client_agent")} == {
        "local_train": 2,
        "client_eval": 4,
        "client_agent": 4,
    }  # per client: one fit, the received and the trained model scored, the agent before and after
    assert all(s >= 0 for s in times.seconds.values())
    assert loop.method.take_times(loop.server).seconds == {}  # taken once


class ServerContextStub(dict):
    """What ``metrics`` reads of the server: its state, like a dict."""


# -- controls, the range and the split the agents are scored on ------------------------------------------
def test_page_with_fixed_actions_trains_every_client_with_fedavgs_lr_and_epochs():
    client = {"epochs": 2, "lr": 0.05}
    cfg = tiny_config("page", {**FAST_AGENTS, "actions": "fixed"}, client=client)
    loop, fedavg = make_loop(cfg), make_loop(tiny_config("fedavg", client=client))
    for _ in range(3):
        loop.run_round()
        fedavg.run_round()
        assert torch.equal(loop.server["global"], fedavg.server["global"])
        rows = loop.method._trained or loop.method._last_round
        assert {(lr, epochs) for lr, epochs, _ in rows.values()} == {(0.05, 2)} and len(rows) == 6
    assert "agent" not in loop.server.state and all("agent" not in s for s in loop.clients.values())


def test_page_with_random_actions_draws_new_in_range_actions_every_round_without_agents():
    args = {**FAST_AGENTS, "actions": "random"}
    loop, twin = make_loop(tiny_config("page", args)), make_loop(tiny_config("page", args))  # no validation split
    seen, weights = set(), []
    for _ in range(3):
        loop.run_round()
        twin.run_round()
        rows = loop.method._trained or loop.method._last_round
        for lr, epochs, reward in rows.values():
            assert 0.01 <= lr <= 0.1 and 1 <= epochs <= 3 and reward is None
            seen.add((lr, epochs))
        w = loop.server["weights"]
        assert abs(float(w.sum()) - 1) < 1e-6 and float(w.max() - w.min()) > 0.05
        weights.append(w.clone())
        assert torch.equal(loop.server["global"], twin.server["global"])  # seeded
    assert len(seen) == 18 and not torch.equal(weights[0], weights[1])  # not constant over clients or rounds
    assert len({e for _, e in seen}) == 3 and max(lr for lr, _ in seen) - min(lr for lr, _ in seen) > 0.05
    assert "agent" not in loop.server.state and all("agent" not in s for s in loop.clients.values())


def test_page_scores_its_agents_on_validation_splits_by_default():
    args = {**FAST_AGENTS, "client_reward_weight": 2.0, "server_reward_weight": 3.0, "penalty": 0.5}
    cfg = page_config(args)
    cfg.method = FixedPAGE(**args)
    assert cfg.method.reward_split == "validation"
    loop = make_loop(cfg)
    worker = loop.worker
    val = torch.cat([worker.split(c).val for c in range(loop.server.num_clients)])
    g0 = loop.server["global"].clone()
    loop.run_round()
    server = loop.server
    assert float(server["reward"]) == pytest.approx(3.0 / (worker.evaluate(server["global"], val).loss + 0.5))
    assert float(server["reward"]) != pytest.approx(3.0 / (server.evaluate(server["global"]).loss + 0.5))
    for cid, (_, _, reward) in loop.method._last_round.items():
        ctx, state = loop.client(cid), loop.clients[cid]
        assert reward == pytest.approx(2.0 / (ctx.evaluate(state["personal"], "val").loss + 0.5))
        assert float(state["obs"]) == pytest.approx(ctx.evaluate(g0, "val").acc)  # the state, too
    for cid, uploaded in ((c, loop.clients[c]["personal"]) for c in range(server.num_clients)):
        assert float(server["acc"][cid]) == pytest.approx(worker.evaluate(uploaded, val).acc)
    assert loop.fit()["hparams"]["reward_split"] == "validation"  # what the report reads


def test_page_refuses_to_score_on_validation_splits_that_do_not_exist():
    with pytest.raises(ConfigError, match="data.val_frac"):
        make_loop(tiny_config("page", FAST_AGENTS))  # the server agent, at start
    loop = make_loop(tiny_config("page", {**FAST_AGENTS, "tune": ["lr", "epochs"]}))
    with pytest.raises(ConfigError, match="data.val_frac"):
        loop.run_round()  # a client agent, before it acts
    make_loop(tiny_config("page", {**FAST_AGENTS, "reward_split": "test"})).run_round()  # the paper's choice


def test_a_single_validation_sample_is_enough_to_score_on():
    from types import SimpleNamespace

    def client(n):
        return SimpleNamespace(cid=4, val_idx=torch.arange(n), evaluate=lambda state, on: (on, len(state)))

    assert PAGE()._client_score(client(1), torch.zeros(3)) == ("val", 3)
    assert PAGE(reward_split="test")._client_score(client(0), torch.zeros(3)) == ("test", 3)
    with pytest.raises(ConfigError, match="data.val_frac") as err:
        PAGE()._client_score(client(0), torch.zeros(3))
    assert "client 4" in str(err.value)


def test_page_options_are_checked():
    for field, bad in (("actions", "frozen"), ("reward_split", "train"), ("action_map", "log"), ("ou_dt", 0.0)):
        with pytest.raises(ConfigError, match=f"method.{field}"):
            PAGE(**{field: bad})
    assert PAGE().action_map == "linear" and PAGE().range.action_map == "linear"
    assert PAGE(action_map="clip").range.action_map == "clip"
    assert PAGE().client_config.ou_dt == 1.0 and PAGE(ou_dt=0.01).client_config.ou_dt == 0.01
    assert PAGE(ou_dt=0.01).server_config(3).ou_dt == 0.01


@pytest.mark.parametrize(("tune", "refused"), [(["lr"], True), (["epochs"], True), (["weights"], True), ([], False)])
def test_the_warmup_check_applies_whenever_an_agent_acts(tune, refused):
    cfg = tiny_config("page", {"warmup": 3, "tune": tune}, trainer={"rounds": 3})
    if refused:
        with pytest.raises(ConfigError, match="method.warmup"):
            cfg.method.check_run(cfg)
    else:
        cfg.method.check_run(cfg)
    shorter = tiny_config("page", {"warmup": 2, "tune": tune}, trainer={"rounds": 3})
    shorter.method.check_run(shorter)


def test_page_explores_with_the_client_agents_only_and_refuses_other_lags():
    method = PAGE()
    assert method.client_config.noise and (method.client_config.state_dim, method.client_config.action_dim) == (1, 2)
    server = method.server_config(5)
    assert not server.noise and (server.state_dim, server.action_dim) == (5, 5)
    for field in ("client_lag", "server_lag"):
        with pytest.raises(ConfigError) as err:
            PAGE(**{field: 2})
        assert str(err.value) == f"method.{field}: unknown value 2 (choose one of 0, 1)"


def test_the_server_agent_reads_a_resumed_state_on_the_training_device():
    """A resumed run's server state is on the training device (checkpoint.restore moves it there), the
    uploads too; the server agent answers on the host and the aggregate stays on the device."""
    from pfl.engine.flat import ModelLayout
    from pfl.engine.trainer import EvalStats
    from pfl.federation.store import tree_map
    from pfl.methods import ServerContext, Upload
    from tests.helpers.device_tags import is_on_device, training_device

    p, k = 4, 3
    method = PAGE(**FAST_AGENTS)
    with training_device() as dev:
        layout = ModelLayout(p, 0, (("0", slice(0, p)),), dev)
        server = ServerContext(0, k, k, layout, torch.zeros(p, device=dev))
        server.val_evaluator = lambda state: EvalStats(int(4 * float(state.sum())) % 5, 1.0 + float(state[0]), 5)
        server.state = tree_map(lambda t: t.to(dev), method.init_server(server))
        for r in range(3):  # past the warm-up: the agent acts and learns
            server.round = r
            uploads = {c: Upload(torch.full((p,), 0.1 * (c + r), device=dev), 1.0) for c in range(k)}
            method.aggregate(server, uploads)
            server.state = tree_map(lambda t: t.to(dev), server.state)  # as every resume would leave it
        assert is_on_device(server["global"]) and float(server["weights"].sum()) == pytest.approx(1.0)
