"""A stacked fit's batches (pfl.engine.batch_feed): the step layout of ragged clients with aligned and
unaligned epochs, and the index table's padded batches against padding written out client by client."""

from __future__ import annotations

import pytest
import torch

from pfl.engine.batch_feed import PaddedFeed, compact_pass, schedule_steps, stack_size, widen
from pfl.engine.stacked import FitRequest, StackedTrainer
from pfl.engine.trainer import FitSpec
from tests.conftest import make_loop, tiny_config


def _streams():
    """Client 0: 2 batches per epoch for 2 epochs; client 1: 1 batch per epoch for 2 epochs; client 2: none."""
    a = [(0, torch.tensor([0])), (0, torch.tensor([1])), (1, torch.tensor([2])), (1, torch.tensor([3]))]
    b = [(0, torch.tensor([10])), (1, torch.tensor([11]))]
    return [a, b, []]


def _layout(steps):
    return [[None if d is None else (d[0], int(d[1][0])) for d in drawn] for drawn in steps]


def test_aligned_epochs_wait_for_each_other_and_unaligned_ones_go_at_their_own_pace():
    aligned = schedule_steps([iter(s) for s in _streams()], aligned=True)
    assert _layout(aligned) == [
        [(0, 0), (0, 10), None],
        [(0, 1), None, None],  # client 1 is done with epoch 0: it waits
        [(1, 2), (1, 11), None],
        [(1, 3), None, None],
    ]
    streams = _streams()
    unaligned = schedule_steps([iter(s) for s in streams], aligned=False)
    assert _layout(unaligned) == [
        [(0, 0), (0, 10), None],
        [(0, 1), (1, 11), None],
        [(1, 2), None, None],
        [(1, 3), None, None],
    ]
    assert unaligned[1][1][1] is streams[1][1][1]  # the streams' own tensors, not copies
    assert schedule_steps([iter([]), iter([])], aligned=True) == []


def _padded(data, batches, least_width):
    """What a step's padded batch is: each client's samples, then copies of its first one up to the step's
    width (its longest batch, at least ``least_width``), masked out; a client without a batch gets sample
    0, fully masked."""
    width = max([least_width, *(len(b) for b in batches if b is not None)])
    xs, ys, masks = [], [], []
    for b in batches:
        n = 0 if b is None else len(b)
        idx = [0] * width if b is None else b.tolist() + [int(b[0])] * (width - n)
        xs.append(data.x[idx])
        ys.append(data.y[idx])
        masks.append(torch.tensor([1.0] * n + [0.0] * (width - n), dtype=torch.float64))
    return torch.stack(xs), torch.stack(ys), torch.stack(masks)


@pytest.mark.parametrize(("static", "rows"), [(False, "active"), (True, "powers"), (True, "all")])
@pytest.mark.parametrize("aligned", [False, True])
def test_the_fits_index_table_gathers_exactly_each_steps_padded_batches(static, rows, aligned):
    loop = make_loop(tiny_config("fedavg", client={"batch_size": 8}))
    w, start = loop.worker, loop.init_state
    epochs = [2, 2, 2, 0] if aligned else [1, 3, 2, 0]
    specs = [FitSpec(epochs=e) for e in epochs]
    specs[2] = FitSpec(epochs=epochs[2], indices=w.split(2).train[:5])  # shorter than one batch
    specs[1] = FitSpec(epochs=epochs[1], indices=w.split(1).train[:9])  # a last batch of one sample
    reqs = [FitRequest.of(w, cid, start, 0, spec) for cid, spec in enumerate(specs)]
    trainer = StackedTrainer(w)
    trainer.static_width = static
    schedule = schedule_steps([trainer._stream(r) for r in reqs], aligned)
    feed = PaddedFeed(schedule, w.settings.batch_size, static, torch.float64, w.device, rows)
    widths, compacted = set(), 0
    for s, drawn in enumerate(schedule):
        batches = [None if d is None else d[1] for d in drawn]
        ready = [j for j, b in enumerate(batches) if b is not None]
        idle = [j for j, b in enumerate(batches) if b is None]
        size = stack_size(len(ready), len(batches), rows)
        # the clients with a batch, in order, filled up with idle ones to the step's size (all: in order)
        clients = list(range(len(batches))) if size == len(batches) else (ready + idle)[:size]
        assert feed.clients[s] == clients, s
        sel = feed.selected[s]
        assert (sel is None) == (clients == list(range(len(batches))))
        assert sel is None or sel.tolist() == clients
        compacted += sel is not None
        x, y, mask = _padded(w.data, [batches[j] for j in clients], w.settings.batch_size if static else 0)
        fx, fy, fmask = feed.step(s, w.data.x, w.data.y)
        assert torch.equal(fx, x) and torch.equal(fy, y) and torch.equal(fmask, mask), s
        assert fmask.dtype == torch.float64 and fmask.is_contiguous() and fx.is_contiguous()
        assert feed.active[s].tolist() == [[b is not None] for b in batches]
        widths.add(x.shape[1])
    # ragged: clients without a batch at some steps, short batches, and (unpadded) narrower steps
    assert any(d is None for drawn in schedule for d in drawn[:3]) and len(schedule) > 1
    assert widths == {8} if static else (8 in widths and len(widths) > 1)
    assert compacted > 0 if rows != "all" else compacted == 0


def test_a_step_trains_the_clients_with_a_batch_a_power_of_two_of_them_or_all():
    assert [stack_size(n, 20, "active") for n in (1, 3, 7, 20)] == [1, 3, 7, 20]
    assert [stack_size(n, 20, "powers") for n in (1, 2, 3, 5, 8, 9, 16, 17, 20)] == [1, 2, 4, 8, 8, 16, 16, 20, 20]
    assert stack_size(3, 3, "powers") == 3
    assert [stack_size(n, 20, "all") for n in (1, 7, 20)] == [20, 20, 20]


def test_a_compacted_steps_results_widen_to_one_row_per_client_zero_for_the_others():
    values = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    out = widen(values, torch.tensor([2, 0]), 4)
    assert torch.equal(out, torch.tensor([[3.0, 4.0], [0.0, 0.0], [1.0, 2.0], [0.0, 0.0]]))
    assert widen(values, None, 2) is values
    assert torch.equal(widen(torch.tensor([5.0]), torch.tensor([1]), 3), torch.tensor([0.0, 5.0, 0.0]))


def test_a_static_step_fills_its_rows_with_clients_without_a_batch_fully_masked():
    x, y = torch.arange(40.0).view(20, 2), torch.arange(20)
    batch = {0: torch.tensor([3, 4]), 2: torch.tensor([5]), 4: torch.tensor([6, 7])}
    schedule = [[(0, batch[j]) if j in batch else None for j in range(6)]]
    for rows, clients in (("powers", [0, 2, 4, 1]), ("active", [0, 2, 4])):
        feed = PaddedFeed(schedule, 2, True, torch.float32, torch.device("cpu"), rows)
        assert feed.clients[0] == clients and feed.selected[0].tolist() == clients
        fx, fy, fmask = feed.step(0, x, y)
        assert fy.tolist() == [[3, 4], [5, 5], [6, 7], [0, 0]][: len(clients)]  # the filler: sample 0
        assert torch.equal(fx, x[fy])
        assert fmask.tolist() == [[1.0, 1.0], [1.0, 0.0], [1.0, 1.0], [0.0, 0.0]][: len(clients)]
        assert feed.active[0].flatten().tolist() == [j in batch for j in range(6)]


def test_a_compact_pass_steps_the_selected_clients_rows_and_keys_and_widen_spreads_its_results():
    calls = []

    def step(p, x, y, mask, key):
        calls.append((p.clone(), key.clone()))
        return p * x.sum() + key.unsqueeze(1), (p.sum(1) + y.sum() * mask.sum()).to(torch.float64)

    params = torch.arange(8.0).view(4, 2)
    keys = (torch.tensor([10.0, 20.0, 30.0, 40.0]),)
    batch = (torch.tensor(2.0), torch.tensor(1.0), torch.tensor(3.0))
    sel = torch.tensor([3, 1])
    g, loss = compact_pass(step, params, batch, keys, sel)
    assert torch.equal(calls[-1][0], params[[3, 1]]) and torch.equal(calls[-1][1], torch.tensor([40.0, 20.0]))
    assert torch.equal(g, torch.tensor([[52.0, 54.0], [24.0, 26.0]]))  # one row per selected client
    assert torch.equal(widen(g, sel, 4), torch.tensor([[0.0, 0.0], [24.0, 26.0], [0.0, 0.0], [52.0, 54.0]]))
    assert torch.equal(widen(loss, sel, 4), torch.tensor([0.0, 8.0, 0.0, 16.0], dtype=torch.float64))
    g, loss = compact_pass(step, params, batch, keys, None)  # every client: the step's own results
    assert widen(g, None, 4) is g
    assert torch.equal(calls[-1][0], params) and torch.equal(g, params * 2 + keys[0].unsqueeze(1))
    assert torch.equal(loss, (params.sum(1) + 3).to(torch.float64))
