"""Scale: the disk client store, the incremental checkpoint chain, evaluation protocols and per-rank
evaluation, and vectorized client training."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from pfl.config import TrainerConfig, validate
from pfl.errors import ConfigError
from pfl.federation.checkpoint import (
    CHAIN_DIR,
    CHECKPOINT,
    PREVIOUS,
    CheckpointChain,
    ListDelta,
    MapDelta,
    load_checkpoint,
    save_checkpoint,
)
from pfl.federation.loop import comparable_metrics
from pfl.federation.store import DiskStore, MemoryStore, tree_bytes, tree_equal
from pfl.methods import methods
from pfl.metrics.evaluate import evaluate_federation, score_clients
from tests.conftest import make_loop, tiny_config
from tests.helpers.cli_runs import child_env

ROOT = Path(__file__).resolve().parents[2]


def _state(k: int, n: int = 64) -> dict:
    return {"personal": torch.full((n,), float(k)), "momentum": torch.arange(n, dtype=torch.float32) * k}


# -- the disk store ---------------------------------------------------------------------------------
def test_disk_store_round_trips_every_state_bit_for_bit(tmp_path):
    g = torch.Generator().manual_seed(0)
    big = torch.randn(10, 10, generator=g)
    states = {
        3: {"personal": torch.randn(7, generator=g), "nested": {"head": torch.randn(2, 3, generator=g), "k": 5}},
        1: {
            "half": torch.randn(4, generator=g).half(),
            "bf16": torch.randn(4, generator=g).bfloat16(),
            "double": torch.randn(3, generator=g).double(),
            "ints": torch.randint(0, 9, (5,), generator=g),
            "mask": torch.tensor([True, False, True]),
            "scalar": torch.tensor(2.5),
            "view": big[:, 3],  # a non-contiguous view of a larger tensor
            "list": [torch.ones(2), (torch.zeros(1), "name", 0.25)],
            "special": torch.tensor([float("nan"), float("inf"), -0.0]),
        },
        7: {},
    }
    store = DiskStore(budget_bytes=0, folder=tmp_path / "spill")  # nothing stays in memory
    for cid, state in states.items():
        store[cid] = state
    assert store.resident_bytes() <= max(tree_bytes(s) for s in states.values())  # at most the one in use
    store[99] = {"x": torch.ones(1)}  # pushes the last one out too
    assert 1 in store.spilled and 3 in store.spilled
    for cid, state in states.items():
        back = store.peek(cid)
        assert tree_equal(back, state), cid
        assert tree_equal(store[cid], state), cid
    nan = store.peek(1)["special"]
    assert torch.isnan(nan[0]) and torch.equal(nan[1:], states[1]["special"][1:])
    assert torch.signbit(nan[2])  # -0.0 stays -0.0
    assert sorted(store) == [1, 3, 7, 99] and len(store) == 4
    assert dict(store.items()).keys() == {1, 3, 7, 99}
    assert not tree_equal(store.peek(3), states[1])  # control: a different state is told apart


def test_lru_eviction_respects_the_budget_and_writes_only_changed_states(tmp_path):
    size = tree_bytes(_state(0))
    store = DiskStore(budget_bytes=3 * size, folder=tmp_path)
    for k in range(6):
        store[k] = _state(k)
        assert store.resident_bytes() <= 3 * size
    assert store.resident == [3, 4, 5] and store.spilled == [0, 1, 2]
    writes = store.writes
    assert torch.equal(store[0]["personal"], _state(0)["personal"])  # back in: the LRU one (3) goes out
    assert store.resident == [4, 5, 0] and store.spilled == [1, 2, 3]
    assert store.writes == writes + 1
    store.peek(1)  # a read that is not kept: nothing displaced, nothing written
    assert store.resident == [4, 5, 0] and store.writes == writes + 1
    # A state handed out and grown in place is re-measured before the next decision.
    store[4]["extra"] = torch.zeros(3 * 64)
    store[6] = {}
    assert store.resident_bytes() <= 3 * size
    assert 4 not in store.resident or 5 not in store.resident
    assert torch.equal(store[4]["extra"], torch.zeros(3 * 64))  # written when it left, read back
    assert len(list((tmp_path).glob("*.pt"))) == len(store.spilled)
    del store[1]
    assert 1 not in store and not (tmp_path / "1.pt").exists()


def test_change_tracking_of_both_stores(tmp_path):
    for store in (MemoryStore(), DiskStore(0, folder=tmp_path)):
        store[1], store[2], store[3] = _state(1), _state(2), _state(3)
        assert store.changes() == ([1, 2, 3], [])
        store.clear_changes()
        _ = store[2]  # read (even handed out) is not a change by itself: the loop marks trained clients
        store.mark_changed([2, 5])  # 5 is not stored: ignored
        del store[3]
        assert store.changes() == ([2], [3])
        store[3] = {}
        assert store.changes() == ([2, 3], [])


def test_disk_store_run_equals_memory_store_run():
    budget = 40_000 / 2**20  # about one MLP state: every round spills and reloads
    cases = (("ditto", {}, False), ("fedavg", {"pm_source": "local_update"}, False), ("local", {}, True))
    for method, ev, vec in cases:  # vectorized: states filled in after the local updates stay pinned
        runs = {}
        for kind in ("memory", "disk"):
            trainer = {"rounds": 4, "client_store": kind, "store_budget_mb": budget, "vectorize": vec}
            cfg = tiny_config(method, trainer=trainer, eval=ev)
            loop = make_loop(cfg)
            runs[kind] = (loop.fit(), loop)
        (a, mem), (b, disk) = runs["memory"], runs["disk"]
        assert comparable_metrics(a) == comparable_metrics(b)
        assert isinstance(disk.clients, DiskStore) and (disk.clients.spilled or disk.evals.trained.spilled)
        assert mem.clients == disk.clients and mem.evals.trained == disk.evals.trained
        assert len(mem.clients) + len(mem.evals.trained) > 0


def test_states_change_only_while_their_client_trains():
    """The contract that incremental checkpoints, the disk store and multi-process rounds rely on:
    a round changes only the sampled clients' states, and evaluation changes none."""
    for name in methods():
        data = {"num_clients": 4, "val_frac": 0.2 if name in ("page", "dapfl") else 0.0}  # agents score on validation
        loop = make_loop(tiny_config(name, trainer={"rounds": 2, "clients_per_round": 2}, data=data))
        for _ in range(2):
            before = {cid: _clone(s) for cid, s in loop.clients.items()}
            sampled = set(loop.sampled_clients().tolist())
            loop.run_round()
            for cid, state in before.items():
                if cid not in sampled:
                    assert tree_equal(loop.clients.peek(cid), state), (name, cid)
        before = {cid: _clone(s) for cid, s in loop.clients.items()}
        loop.evaluate()
        assert loop.clients == before, name


def _clone(tree):
    if isinstance(tree, torch.Tensor):
        return tree.clone()
    if isinstance(tree, dict):
        return {k: _clone(v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(_clone(v) for v in tree)
    return tree


# -- the checkpoint chain -------------------------------------------------------------------------
def test_chain_links_hold_only_what_changed_and_resolve_to_the_whole_state(tmp_path):
    chain = CheckpointChain(tmp_path)
    clients = {k: _state(k) for k in range(5)}
    chain.save({"round": 0, "server": {"w": torch.zeros(3)}}, {"clients": MapDelta(clients.items())},
               {"history": ListDelta(0, [{"round": 0}])}, base=True)  # fmt: skip
    clients[2] = _state(20)
    del clients[4]
    chain.save({"round": 1, "server": {"w": torch.ones(3)}}, {"clients": MapDelta([(2, clients[2])], [4])},
               {"history": ListDelta(1, [{"round": 1}])})  # fmt: skip
    clients[4] = _state(40)
    chain.save({"round": 2, "server": {"w": torch.full((3,), 2.0)}}, {"clients": MapDelta([(4, clients[4])])},
               {"history": ListDelta(2, [])})  # fmt: skip
    chain.wait()
    head = torch.load(tmp_path / CHECKPOINT, weights_only=True)
    assert list(head["clients"]) == [4] and head["round"] == 2 and head["history"] == []
    state = load_checkpoint(tmp_path)
    assert state["round"] == 2 and torch.equal(state["server"]["w"], torch.full((3,), 2.0))
    assert state["history"] == [{"round": 0}, {"round": 1}]
    assert tree_equal(state["clients"], clients)
    assert sorted(p.name for p in (tmp_path / CHAIN_DIR).iterdir()) == [
        f"{chain._lineage[head['_chain']['parent']].parent}.pt"
    ]
    # the fallback (checkpoint.prev.pt) is the round-1 link, whose chain is still there
    (tmp_path / CHECKPOINT).write_bytes(b"")  # damaged
    older = load_checkpoint(tmp_path)
    assert (
        older["round"] == 1
        and 4 not in older["clients"]
        and torch.equal(older["clients"][2]["personal"], clients[2]["personal"])
    )


def test_a_base_spans_segments_and_compaction_drops_unreachable_links(tmp_path):
    size = tree_bytes(_state(0))
    chain = CheckpointChain(tmp_path, segment_bytes=2 * size)
    clients = {k: _state(k) for k in range(7)}
    chain.save({"round": 0}, {"clients": MapDelta(clients.items())}, base=True)
    segments = sorted(p.name for p in (tmp_path / CHAIN_DIR).iterdir())
    assert len(segments) == 3  # 7 states, 2 per segment file, 1 left in the link itself
    assert len(torch.load(tmp_path / CHECKPOINT, weights_only=True)["clients"]) == 1
    rounds = 0
    while not chain.due_for_base():  # deltas until they add up to the base's size
        rounds += 1
        clients[rounds % 7] = _state(100 + rounds)
        chain.save({"round": rounds}, {"clients": MapDelta([(rounds % 7, clients[rounds % 7])])})
    assert 3 <= rounds <= 8
    assert tree_equal(load_checkpoint(tmp_path)["clients"], clients)
    chain.save({"round": rounds + 1}, {"clients": MapDelta(clients.items())}, base=True)
    chain.save({"round": rounds + 2}, {"clients": MapDelta([])})
    # only the new base's segments are left (the base is checkpoint.prev.pt, the delta checkpoint.pt)
    chain.wait()
    left = sorted(p.name for p in (tmp_path / CHAIN_DIR).iterdir())
    assert len(left) == 3 and all(name.startswith(f"{rounds + 1:09d}-") for name in left)
    assert tree_equal(load_checkpoint(tmp_path)["clients"], clients)


def test_a_missing_chain_link_falls_back_in_one_line(tmp_path, capsys):
    chain = CheckpointChain(tmp_path)
    for r in range(4):
        chain.save({"round": r}, {"clients": MapDelta([(r, _state(r))])}, base=r == 0)
    for link in (tmp_path / CHAIN_DIR).iterdir():  # the links behind checkpoint.prev.pt
        link.unlink()
    with pytest.raises(ConfigError) as err:
        load_checkpoint(tmp_path)
    assert "is missing" in str(err.value) and str(tmp_path / PREVIOUS) in str(err.value)


def test_incremental_chain_resumes_to_the_numbers_of_a_full_checkpoint(tmp_path):
    def config(rounds):
        return tiny_config(
            "ditto", trainer={"rounds": rounds, "clients_per_round": 2}, eval={"pm_source": "local_update"}
        )

    straight = make_loop(config(8))
    expected = straight.fit()
    chained = make_loop(config(4), run_dir=tmp_path / "chain")
    chained.fit()
    assert chained.checkpointer.chain.head.depth > 0  # deltas were written
    full = tmp_path / "full"
    full.mkdir()
    save_checkpoint(full, chained.checkpointer.state_dict())
    assert tree_equal(load_checkpoint(tmp_path / "chain"), load_checkpoint(full))
    for source in ("chain", "full"):
        resumed = make_loop(config(8), run_dir=tmp_path / f"resumed-{source}")
        assert resumed.checkpointer.resume(tmp_path / source)
        assert comparable_metrics(resumed.fit()) == comparable_metrics(expected), source
        assert resumed.clients == straight.clients and torch.equal(resumed.server["global"], straight.server["global"])


def test_checkpoint_cost_follows_the_sampled_clients_not_n(tmp_path):
    written = {}
    for n in (6, 24):
        loop = make_loop(
            tiny_config("ditto", trainer={"rounds": 12, "clients_per_round": 2}, data={"num_clients": n}),
            run_dir=tmp_path / str(n),
        )
        sizes = []
        while loop.round < 12:
            loop.run_round()
            loop.checkpointer.save()
            sizes.append(loop.checkpointer.chain.last_bytes)
        written[n] = sizes
    model = loop.init_state.numel() * 4
    # A delta holds the server's model and the 2 trained clients' states, whatever N is.
    deltas = {n: [b for b in s[1:] if b < 4 * model] for n, s in written.items()}
    assert all(len(d) >= 6 for d in deltas.values())
    assert max(deltas[24]) < 1.1 * max(deltas[6])
    # Amortised over the run, 4x the clients costs far less than 4x the bytes.
    assert sum(written[24]) < 2 * sum(written[6])


def test_checkpoints_are_written_every_round_or_when_they_cost_under_a_twentieth(tmp_path):
    loop = make_loop(tiny_config("fedavg", trainer={"rounds": 20, "checkpoint_every": 4}), run_dir=tmp_path)
    assert loop.checkpointer.due(loop.round)  # the first one measures what a checkpoint costs
    loop.run_round()
    loop.checkpointer.save()
    loop.checkpointer.save_cost = 1e6  # expensive: only the cap on rounds lost applies
    due = []
    for _ in range(8):
        loop.run_round()
        due.append(loop.checkpointer.due(loop.round))
        if due[-1]:
            loop.checkpointer.save()
            loop.checkpointer.save_cost = 1e6
    assert due == [False, False, False, True] * 2
    loop.checkpointer.save_cost = 0.0  # cheap: after every round
    loop.run_round()
    assert loop.checkpointer.due(loop.round)
    assert TrainerConfig().checkpoint_every == 1  # the default, as below
    every = make_loop(tiny_config("fedavg", trainer={"checkpoint_every": 1}), run_dir=tmp_path / "b")
    every.run_round()
    every.checkpointer.save()
    every.checkpointer.save_cost = 1e6
    every.run_round()
    assert every.checkpointer.due(every.round)  # the default: a killed run loses at most one round


def test_checkpoint_every_0_writes_no_checkpoint_and_trains_the_same(tmp_path):
    summaries = {}
    for every in (0, 1):
        loop = make_loop(
            tiny_config("ditto", trainer={"rounds": 3, "checkpoint_every": every}), run_dir=tmp_path / f"e{every}"
        )
        summaries[every] = comparable_metrics(loop.fit())
    assert not list((tmp_path / "e0").glob("checkpoint*"))
    assert (tmp_path / "e1" / "checkpoint.pt").is_file()
    assert summaries[0] == summaries[1]


FIT = [
    "--config", "conf/method/ditto.yaml", "--data.num_clients", "8", "--trainer.fraction", "0.5",
    "--trainer.rounds", "60", "--trainer.eval_every", "20", "--model.hidden", "[16]", "--client.epochs", "1",
    "--trainer.client_store", "disk", "--trainer.store_budget_mb", "0.05",
    "--tracking.wandb", "false", "--trainer.progress", "false",
]  # fmt: skip


def test_disk_store_run_killed_and_resumed_matches_uninterrupted_run(tmp_path):
    env = child_env()

    def fit(name, *extra):
        cmd = [sys.executable, "-m", "pfl", "fit", *FIT, "--tracking.root", str(tmp_path), "--tracking.name", name]
        return subprocess.Popen([*cmd, *extra], cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    full, victim = fit("full"), fit("victim")
    deadline = time.time() + 120
    while time.time() < deadline:
        try:
            state = torch.load(tmp_path / "victim" / CHECKPOINT, weights_only=True)
            if state["round"] >= 10:
                break
        except Exception:  # not there yet, or being replaced
            pass
        time.sleep(0.05)
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    assert not (tmp_path / "victim" / "summary.json").exists(), "the run finished before it could be killed"
    resumed = subprocess.run(
        [sys.executable, "-m", "pfl", "fit", "--resume", str(tmp_path / "victim"), "--trainer.progress", "false"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr
    assert full.wait(timeout=300) == 0
    a = json.loads((tmp_path / "full" / "summary.json").read_text())
    b = json.loads((tmp_path / "victim" / "summary.json").read_text())
    assert comparable_metrics(a) == comparable_metrics(b) and b["rounds"] == 60
    sa, sb = load_checkpoint(tmp_path / "full"), load_checkpoint(tmp_path / "victim")
    assert tree_equal(sa["clients"], sb["clients"]) and len(sa["clients"]) == 8


# -- evaluation protocols -------------------------------------------------------------------------
def test_sg_tests_only_when_asked_for():
    default = make_loop(tiny_config("fedavg", trainer={"rounds": 1}))
    m = default.fit()["metrics"]
    assert default.evals._sets is None and not any(k.startswith(("pm.s_", "pm.g_")) for k in m)
    assert "gm.l_acc.mean" in m
    full = tiny_config("fedavg", trainer={"rounds": 1}, eval={"protocols": ["local", "sg"]})
    m = make_loop(full).fit()["metrics"]
    assert {"pm.s_acc.mean", "pm.g_acc.mean"} <= set(m) and not any(k.startswith("gm.") for k in m)
    for bad in (["local", "ood"], ["sg", "global"]):
        with pytest.raises(ConfigError, match="eval.protocols"):
            validate(tiny_config("fedavg", eval={"protocols": bad}))


def test_each_rank_scores_its_share_and_the_gathered_rows_give_the_same_metrics():
    loop = make_loop(tiny_config("ditto", trainer={"rounds": 2}, eval={"protocols": ["local", "sg", "global"]}))
    loop.fit()
    from pfl.metrics.evaluate import EvalSets

    sets = EvalSets.build(loop.worker, 0, 0.5)
    args = (loop.method, loop.server, loop.worker, loop.peek_client)
    whole, whole_rows = evaluate_federation(*args, sets)
    shares = [[0, 2, 5], [1, 3, 4]]
    parts = [score_clients(*args, shares[1], sets, global_test=False)]
    calls = []

    def gather(mine):
        calls.append(mine)
        return [mine, *parts]

    split, rows = evaluate_federation(*args, sets, share=shares[0], rank=0, gather=gather)
    assert len(calls) == 1 and [r["client"] for r in calls[0][0]] == shares[0]
    assert split == whole and rows == whole_rows
    # block-wise scoring (a block per client) changes the passes, not the numbers
    assert evaluate_federation(*args, sets, block_bytes=0) == (whole, whole_rows)


def test_only_the_reportable_rounds_keep_their_client_rows():
    """Pruning after every evaluation keeps exactly the rows ``select`` can still report: the latest
    round's and the best round's so far (ties: the earliest), whatever the sequence of scores."""
    import numpy as np

    loop = make_loop(tiny_config("fedavg", data={"val_frac": 0.2}))
    rng = np.random.default_rng(0)
    for select, key in (("best_val", "pm.val_acc.mean"), ("best_test", "pm.l_acc.mean"), ("final", "pm.l_acc.mean")):
        evals = loop.evals
        evals.cfg.select = select
        history, evals.rows = [], {}
        for r in range(1, 30):
            history.append({"round": r, key: float(rng.integers(0, 5)) / 4})  # many ties
            evals.rows[r] = [{"client": 0, "round": r}]
            evals.keep_rows(history)
            best = max(history, key=lambda h: (h[key], -h["round"]))["round"] if select != "final" else r
            assert set(evals.rows) == {best, r}, (select, r)
        assert evals.select(history)[1] == [{"client": 0, "round": best}]


# -- vectorized training ----------------------------------------------------------------------------
VECTOR_CASES = [
    ("fedavg", {}, {"momentum": 0.9, "weight_decay": 1e-3}, {"augment": "flip"}),
    ("fedprox", {"mu": 0.1}, {"momentum": 0.5}, {}),
    ("local", {}, {"epochs": 2}, {}),
    ("ditto", {"prox": "exact", "lam": 0.5}, {}, {}),
    ("ditto", {"prox": "gradient", "lam": 0.5}, {"weight_decay": 1e-3}, {}),
]


@pytest.mark.parametrize(
    ("method", "args", "client", "data"), VECTOR_CASES, ids=[c[0] + str(c[1]) for c in VECTOR_CASES]
)
def test_vectorized_rounds_equal_the_sequential_rounds(method, args, client, data):
    """Clients of unequal sizes (Dirichlet split, batch 16: different numbers of batches and short last
    batches) trained together end where each would alone, within float summation order."""
    loops = {}
    for vec in (False, True):
        cfg = tiny_config(method, args, trainer={"rounds": 3, "vectorize": vec}, client=client, data=data)
        loops[vec] = make_loop(cfg)
        loops[vec].fit()
    seq, vec = loops[False], loops[True]
    sizes = {len(seq.worker.split(c).train) for c in range(6)}
    assert len(sizes) > 1  # unequal clients: padding and masking are exercised
    if "global" in seq.server.state:
        torch.testing.assert_close(vec.server["global"], seq.server["global"], rtol=0, atol=1e-5)
    assert seq.clients.keys() == vec.clients.keys()
    for cid in seq.clients:
        for key, value in seq.clients[cid].items():
            torch.testing.assert_close(vec.clients[cid][key], value, rtol=0, atol=1e-5)
    for key in ("train.loss", "pm.l_acc.mean"):
        assert vec.history[-1][key] == pytest.approx(seq.history[-1][key], abs=1e-5)
    assert vec.progress.train_samples == seq.progress.train_samples
    assert not torch.equal(
        vec.init_state, (vec.server.state.get("global") if "global" in vec.server.state else vec.clients[0]["personal"])
    )


def test_vectorize_refuses_what_it_cannot_do_exactly():
    from pfl.engine.stacked import model_problems
    from pfl.engine.trainer import ClientTrainer, TrainSettings

    cases = [
        tiny_config("ditto", {"prox": "autograd"}, trainer={"vectorize": True}),
        tiny_config("fedavg", trainer={"vectorize": True, "precision": "16-mixed"}),
    ]
    for cfg in cases:
        with pytest.raises(ConfigError, match="trainer.vectorize"):
            make_loop(cfg)
    data = make_loop(tiny_config("fedavg")).worker.data
    dim = data.x[0].numel()
    nets = {
        # BatchNorm stacks with per-client running statistics, unless it averages them cumulatively.
        "BatchNorm": torch.nn.Sequential(
            torch.nn.Flatten(), torch.nn.Linear(dim, 4), torch.nn.BatchNorm1d(4, momentum=None)
        ),
        "dropout": torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Dropout(0.2), torch.nn.Linear(dim, 10)),
        "": torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Dropout(0.0), torch.nn.Linear(dim, 10)),
    }
    for word, net in nets.items():
        reasons = model_problems(ClientTrainer(net, data, TrainSettings(), seed=0))
        assert (word in " ".join(reasons)) if word else reasons == []
