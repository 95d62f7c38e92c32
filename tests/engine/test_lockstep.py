"""The lockstep handoff (pfl.engine.lockstep): clients run one at a time in order, their stackable fits,
full passes and gradient calls are served together, and each client resumes with the worker as its
sequential call leaves it; what cannot stack runs on the worker at once; a client's exception stops the
round. Whole rounds of every method: ``test_lockstep_real_runs.py``; a method's own gradient calls:
``test_batch_gradients.py``."""

from __future__ import annotations

import threading
import traceback
from dataclasses import replace

import pytest
import torch

from pfl.engine.lockstep import Lockstep
from pfl.engine.stacked import StackedTrainer
from pfl.engine.trainer import ClientTrainer, FitSpec, TrainSettings
from pfl.seeding import seed_everything
from tests.engine.test_batch_gradients import _own_loop
from tests.engine.test_stacked import _dropout_net, _worker

CUSTOM = FitSpec(loss_fn=lambda net, x, y: net(x).square().mean())  # a custom loss: no stacked form


def _lockstep():
    loop = _worker()
    return loop, Lockstep(loop.worker, StackedTrainer(loop.worker))


def _global_dropout_worker() -> ClientTrainer:
    """A worker whose model draws dropout from torch's global generator: no fit of it stacks."""
    data = _worker().worker.data
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Flatten(), torch.nn.Linear(data.x[0].numel(), 16), torch.nn.Dropout(0.2), torch.nn.Linear(16, 10)
    )
    return ClientTrainer(net, data, TrainSettings(batch_size=16), seed=0)


def _threads_left() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("pfl-lockstep")]


@pytest.mark.parametrize("grad_mode", [False, True])
def test_a_client_resumes_with_the_worker_as_its_sequential_fit_leaves_it(grad_mode):
    loop, lockstep = _lockstep()
    w, start = loop.worker, loop.init_state
    seen = {}

    def update(cid):
        def run(worker):
            stats = worker.train(cid, start, 0, FitSpec(purpose="p"))
            seen[cid] = (worker.snapshot(), worker.momentum_buffer(), torch.rand(3), torch.is_grad_enabled(), stats)
            return cid

        return run

    with torch.set_grad_enabled(grad_mode):  # the clients' threads see the caller's grad mode
        assert lockstep.run([update(c) for c in (0, 1, 2)]) == [0, 1, 2]
    assert lockstep.stacked_fits == 3 and lockstep.sequential_fits == 0
    for cid, (state, momentum, draw, grad, stats) in seen.items():
        expected = w.train(cid, start, 0, FitSpec(purpose="p"))
        torch.testing.assert_close(state, w.snapshot(), rtol=0, atol=1e-5)
        torch.testing.assert_close(momentum, w.momentum_buffer(), rtol=0, atol=1e-5)
        assert torch.equal(draw, torch.rand(3))  # the global generator as the fit's key leaves it
        assert grad is grad_mode
        assert stats.steps == expected.steps > 0
        assert stats.loss == pytest.approx(expected.loss, abs=1e-6)
    seed_everything(0)


def test_a_fit_that_cannot_stack_runs_on_the_worker_at_once_and_its_momentum_is_the_workers():
    loop, lockstep = _lockstep()
    w, start = loop.worker, loop.init_state
    order, seen = [], {}

    def update(cid):
        def run(worker):
            worker.train(cid, start, 0, FitSpec(purpose="stacked"))
            order.append(("stacked done", cid))
            worker.train(cid, start, 0, replace(CUSTOM, purpose="custom"))
            order.append(("custom done", cid))
            buf = worker.momentum_buffer()
            seen[cid] = (worker.snapshot(), buf.clone())
            buf.add_(1.0)  # the caller's copy: a second read is unchanged
            torch.testing.assert_close(worker.momentum_buffer(), seen[cid][1], rtol=0, atol=0)

        return run

    lockstep.run([update(c) for c in (0, 1)])
    assert (lockstep.stacked_fits, lockstep.sequential_fits) == (2, 2)
    # the custom fit ran in the client's own turn, right after its stacked fit was served
    assert order == [("stacked done", 0), ("custom done", 0), ("stacked done", 1), ("custom done", 1)]
    for cid, (state, momentum) in seen.items():
        w.train(cid, start, 0, FitSpec(purpose="stacked"))
        w.train(cid, start, 0, replace(CUSTOM, purpose="custom"))
        torch.testing.assert_close(state, w.snapshot(), rtol=0, atol=0)  # trained on the worker itself
        torch.testing.assert_close(momentum, w.momentum_buffer(), rtol=0, atol=0)  # the custom fit's


def test_the_momentum_of_a_stacked_fit_is_a_copy_each_time():
    loop, lockstep = _lockstep()

    def run(worker):
        assert worker.momentum_buffer() is None  # before any fit: the worker's own (none yet)
        worker.train(0, loop.init_state, 0)
        first = worker.momentum_buffer()
        first.add_(1.0)
        return first, worker.momentum_buffer()

    ((first, second),) = lockstep.run([run])
    torch.testing.assert_close(second, first - 1.0, rtol=0, atol=1e-6)


def test_stacks_counts_each_fit_and_refuses_what_has_no_stacked_form():
    loop, lockstep = _lockstep()
    assert lockstep.model_ok
    assert lockstep.stacks(FitSpec()) and not lockstep.stacks(CUSTOM) and lockstep.stacks(FitSpec(epochs=3))
    assert (lockstep.stacked_fits, lockstep.sequential_fits) == (2, 1)
    drawn = _global_dropout_worker()
    other = Lockstep(drawn, StackedTrainer(drawn))
    assert not other.model_ok and not other.stacks(FitSpec())
    assert (other.stacked_fits, other.sequential_fits) == (0, 1)


def test_stacked_nothing_names_the_first_lone_fit_while_nothing_has_stacked():
    loop, lockstep = _lockstep()
    assert lockstep.stacked_nothing() is None  # no fit yet: nothing ran alone
    drawn = _global_dropout_worker()
    other = Lockstep(drawn, StackedTrainer(drawn))
    assert not other.stacks(CUSTOM) and not other.stacks(FitSpec())
    assert other.stacked_nothing() == "a model that stacks no fit"  # the first lone fit's reason
    assert not lockstep.stacks(CUSTOM) and not lockstep.stacks(replace(CUSTOM, epochs=2))
    assert lockstep.stacked_nothing() == "a custom loss (loss_fn)"
    # a stacked fit, full pass or gradient call of a method, or any mix of them: something stacked
    for counts in [(1, 0, 0), (0, 1, 0), (0, 0, 1), (1, 1, 0), (0, 1, 1), (1, 1, 1)]:
        lockstep.stacked_fits, lockstep.stacked_gradients, lockstep.stacked_batch_gradients = counts
        assert lockstep.stacked_nothing() is None, counts


def _full_pass(cid: int, state: torch.Tensor, round_idx: int | None = 3):
    """A local update whose only request is PGFed's full pass, from a model left in eval mode (``round_idx``
    None: the call's default round)."""

    def run(worker):
        worker.module.eval()
        at = state + 0.01 * cid
        grad, loss = worker.mean_gradient(cid, at) if round_idx is None else worker.mean_gradient(cid, at, round_idx)
        return grad, loss, worker.flat.snapshot(), worker.flat.grads.clone(), worker.module.training

    return run


def test_full_passes_are_served_together_and_leave_the_worker_as_the_sequential_pass():
    """BatchNorm's running statistics and keyed dropout (each batch's masks keyed by the call's round, the
    first client's by the default round) in the pass."""
    data = _worker().worker.data
    w = ClientTrainer(_dropout_net(data.x[0].numel(), batch_norm=True), data, TrainSettings(batch_size=16), seed=0)
    assert w.keyed_dropout
    start = w.flat.snapshot()
    cids = [0, 1, 2]
    updates = [_full_pass(0, start, None), _full_pass(1, start), _full_pass(2, start)]
    expected = [u(w) for u in updates]
    lockstep = Lockstep(w, StackedTrainer(w))
    got = lockstep.run(updates)
    assert lockstep.stacked_gradients == 3
    p = w.flat.num_params
    for cid, (grad, loss, state, grads, training), (g, l_, s, gs, t) in zip(cids, got, expected, strict=True):
        torch.testing.assert_close(grad, g, rtol=0, atol=1e-6)
        assert loss == pytest.approx(l_, abs=1e-6)
        torch.testing.assert_close(state, s, rtol=0, atol=1e-6)
        assert not torch.equal(state[p:], (start + 0.01 * cid)[p:])  # running statistics moved by the pass
        assert not grads.any() and not gs.any()  # the gradient zeroed
        assert training and t  # train mode, as the sequential pass leaves it


def test_full_passes_on_a_model_that_cannot_stack_run_on_the_worker_at_once():
    w = _global_dropout_worker()
    start = w.flat.snapshot()
    torch.manual_seed(5)
    expected = _full_pass(1, start)(w)
    lockstep = Lockstep(w, StackedTrainer(w))
    torch.manual_seed(5)
    (got,) = lockstep.run([_full_pass(1, start)])
    assert lockstep.stacked_gradients == 0
    torch.testing.assert_close(got[0], expected[0], rtol=0, atol=0)  # the same global dropout masks
    assert got[1] == expected[1]


def test_fits_full_passes_and_gradient_calls_pending_together_are_all_served_in_one_turn():
    loop, lockstep = _lockstep()
    w, start = loop.worker, loop.init_state

    def fit(worker):
        worker.train(0, start, 0)
        return worker.snapshot()

    updates = [fit, _full_pass(1, start), _own_loop(2, start)]
    expected = [u(w) for u in updates]
    served = []
    for kind in ("train", "mean_gradients", "batch_gradients"):
        real = getattr(lockstep.trainer, kind)
        setattr(
            lockstep.trainer, kind, lambda reqs, real=real, kind=kind: served.append((kind, len(reqs))) or real(reqs)
        )
    got = lockstep.run(updates)
    torch.testing.assert_close(got[0], expected[0], rtol=0, atol=1e-5)
    for a, b in zip(got[1][:3], expected[1][:3], strict=True):
        torch.testing.assert_close(torch.as_tensor(a), torch.as_tensor(b), rtol=0, atol=1e-6)
    for a, b in zip(got[2], expected[2], strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
    # the first turn: one request of each kind, served together; then client 2's further gradient calls
    assert served[:3] == [("train", 1), ("mean_gradients", 1), ("batch_gradients", 1)]
    assert {kind for kind, _ in served[3:]} == {"batch_gradients"}
    assert lockstep.stacked_batch_gradients == len(served) - 2


def test_clients_finish_at_their_own_pace_and_results_keep_their_order():
    loop, lockstep = _lockstep()
    start = loop.init_state
    turns = []

    def update(cid, fits):
        def run(worker):
            for f in range(fits):
                turns.append((cid, f))
                worker.train(cid, start, 0, replace(FitSpec(), purpose=f"fit{f}"))
            turns.append((cid, "end"))
            return cid * 10

        return run

    assert lockstep.run([update(0, 2), update(1, 0), update(2, 1)]) == [0, 10, 20]
    # each turn resumes the waiting clients in order; one that ends drops out
    assert turns == [(0, 0), (1, "end"), (2, 0), (0, 1), (2, "end"), (0, "end")]
    assert lockstep.stacked_fits == 3
    assert lockstep.run([]) == []


def test_a_clients_exception_reaches_the_caller_and_no_thread_is_left():
    loop, lockstep = _lockstep()
    start = loop.init_state
    reached = []

    def failing(worker):
        worker.train(1, start, 0)
        raise ValueError("client 1 failed after its fit")

    def waiting(cid):
        def run(worker):
            worker.train(cid, start, 0)
            worker.train(cid, start, 0, replace(FitSpec(), purpose="second"))
            reached.append(cid)

        return run

    with pytest.raises(ValueError, match="client 1 failed") as info:
        lockstep.run([waiting(0), failing, waiting(2)])
    assert "failing" in "".join(traceback.format_tb(info.value.__traceback__))  # the client's own frame
    assert reached == []  # the round stopped: no client went past the failure's stacked step
    assert not _threads_left()
    assert lockstep.run([waiting(0)]) == [None] and reached == [0]  # and the lockstep is usable again


def test_a_client_that_fails_before_any_request_stops_the_round_before_the_next_client_starts():
    loop, lockstep = _lockstep()
    started = []

    def failing(worker):
        raise KeyError("no such client")

    def later(cid):
        def run(worker):
            started.append(cid)
            worker.train(cid, loop.init_state, 0)

        return run

    with pytest.raises(KeyError, match="no such client"):
        lockstep.run([failing, later(1), later(2)])
    assert started == [] and not _threads_left()
    assert lockstep.stacked_fits == 0
    assert lockstep.run([later(1), later(2)]) == [None, None] and started == [1, 2]
