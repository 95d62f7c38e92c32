"""pfl/metrics/row_keys.py: the row builder writes, and the summaries read, the keys the built-in protocols
declare, for both tasks."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

from pfl.data import ClientSplit, FederatedData
from pfl.engine.trainer import ClientTrainer, TrainSettings
from pfl.methods import ClientContext
from pfl.methods.fedavg import FedAvg
from pfl.metrics.evaluate import EvalSets, evaluate_federation, honest_metrics
from pfl.metrics.protocol_registry import BUILT_IN
from pfl.metrics.row_keys import RowKeys

BASICS = {"client", "n_train", "n_test"}  # what a row says about the client, not a score


def _federation(task: str, clients: int = 4) -> tuple[ClientTrainer, torch.Tensor]:
    """``clients`` clients with train, validation and test samples, a global test set, and a model state."""
    per, n = 6, clients * 6 + 4
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(n, 2, generator=gen)
    y = torch.randn(n, generator=gen) if task == "regression" else torch.randint(0, 2, (n,), generator=gen)
    train, test, val = torch.arange(2), torch.arange(2, 5), torch.tensor([5])  # client 0's; client k's are shifted
    splits = [ClientSplit(train + k * per, test + k * per, val + k * per) for k in range(clients)]
    data = FederatedData("keys", x, y, 2, splits, torch.arange(clients * per, n))
    outputs = 1 if task == "regression" else 2
    worker = ClientTrainer(nn.Sequential(nn.Flatten(), nn.Linear(2, outputs)), data, TrainSettings(), seed=0)
    return worker, worker.snapshot()


def _evaluate(worker: ClientTrainer, state: torch.Tensor, sg: bool, with_global: bool):
    sets = EvalSets.build(worker, seed=0, share_of_others=0.5) if sg else None
    ctx = lambda cid: ClientContext(cid, 0, worker, {}, state)  # noqa: E731
    return evaluate_federation(FedAvg(), {"global": state}, worker, ctx, sets, with_global=with_global)


@pytest.mark.parametrize("task", ["classification", "regression"])
@pytest.mark.parametrize(("sg", "with_global"), [(False, False), (True, True)])
def test_rows_hold_the_protocols_keys_and_the_summaries_read_every_one(task, sg, with_global):
    worker, state = _federation(task)
    assert worker.task == task
    keys = RowKeys(task)
    metrics, rows = _evaluate(worker, state, sg, with_global)
    protocols = ["local"] + ["sg"] * sg + ["global"] * with_global
    declared = {k for p in protocols for k in keys.protocol(p)}
    for row in rows:
        assert set(row) - BASICS == declared  # the builder writes exactly the declared keys
    for key in declared:  # the summary of every row key: a summarizer reading another spelling misses it
        assert metrics[f"{key}.mean"] == pytest.approx(sum(r[key] for r in rows) / len(rows)), key
    honest = honest_metrics(rows, {0}, task)
    for key in declared:
        assert f"honest.{key}.mean" in honest, key
    score, loss = keys.gm_global
    assert (score in metrics and loss in metrics) == with_global
    summarized = {k.rsplit(".", 1)[0] for k in metrics if k.endswith(".mean")}
    assert summarized == declared  # and nothing the rows do not hold


def test_the_keys_are_spelled_as_the_runs_already_written_spell_them():
    c, r = RowKeys("classification"), RowKeys("regression")
    assert c.protocol("local") == ("pm.l_acc", "pm.l_loss", "pm.val_acc")
    assert r.protocol("local") == ("pm.mae", "pm.l_loss", "pm.val_mae")  # the one exception: pm.mae
    assert c.protocol("sg") == ("pm.s_acc", "pm.g_acc") and r.protocol("sg") == ("pm.s_mae", "pm.g_mae")
    assert c.protocol("global") == ("gm.l_acc", "gm.l_loss") and r.gm_global == ("gm.mae", "gm.loss")
    assert c.protocol("new") == ()  # not a row key: one value per held-out client set


def test_the_built_in_protocols_describe_their_declared_keys():
    keys = RowKeys("classification")
    for name in ("local", "sg", "global"):
        assert all(key in BUILT_IN[name] for key in keys.protocol(name)), name


def test_the_keys_of_a_task_are_a_value_no_reader_can_change():
    keys = RowKeys("classification")  # one instance is shared by readers (pfl.metrics.protocol_registry)
    with pytest.raises(dataclasses.FrozenInstanceError):
        keys.task = "regression"  # type: ignore[misc]
    assert keys.own == "pm.l_acc"
    assert keys == RowKeys("classification") and len({keys, RowKeys("classification"), RowKeys("regression")}) == 2
