"""A method's own gradient calls in lockstep (``LockstepTrainer.gradient``, ``StackedTrainer.batch_gradients``):
the clients' calls are served together, and each client resumes with the worker as its sequential call
would have left it. pFedMe, Per-FedAvg and FedALA are compared whole in ``test_lockstep_real_runs.py``."""

from __future__ import annotations

import torch

from pfl.engine.lockstep import Lockstep
from pfl.engine.stacked import StackedTrainer
from pfl.engine.trainer import ClientTrainer, TrainSettings
from tests.engine.test_stacked import _bn_net, _worker


def _own_loop(cid: int, start: torch.Tensor):
    """A local update with its own loop: two gradient calls per batch (each augmenting from the batches'
    generator), an SGD step on the loaded parameters, and a draw from torch's global generator."""

    def update(trainer) -> list[torch.Tensor]:
        flat, seen = trainer.flat, []
        flat.load(start + 0.01 * cid)
        for b in trainer.batches(cid, 0, "own", 2):
            for _ in range(2):
                loss = trainer.gradient(b)
                seen += [flat.grads.clone(), loss.reshape(1)]
                with torch.no_grad():
                    flat.params.sub_(flat.grads, alpha=0.1)
            seen.append(torch.rand(1))
        return [*seen, flat.snapshot()]

    return update


def test_own_gradient_calls_are_served_together_and_each_client_resumes_with_its_own_worker():
    w = _worker().worker
    assert w.augment is not None  # augmentation on: each call draws from its client's generator
    start = w.flat.snapshot()
    cids = [0, 1, 2, 3]
    expected = [_own_loop(c, start)(w) for c in cids]
    lockstep = Lockstep(w, StackedTrainer(w))
    got = lockstep.run([_own_loop(c, start) for c in cids])
    calls = sum(2 * len(list(w.batches(c, 0, "own", 2))) for c in cids)
    assert lockstep.stacked_batch_gradients == calls and lockstep.sequential_gradients == 0
    for a, b in zip(got, expected, strict=True):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            torch.testing.assert_close(x, y, rtol=0, atol=1e-6)


def test_gradient_calls_with_a_custom_loss_or_on_a_model_with_running_statistics_run_on_the_worker():
    w = _worker().worker
    start = w.flat.snapshot()

    def custom(trainer):
        trainer.flat.load(start)
        b = next(iter(trainer.batches(0, 0, "own", 1)))
        trainer.gradient(b, lambda net, x, y: net(x).square().mean())
        return trainer.flat.grads.clone()

    lockstep = Lockstep(w, StackedTrainer(w))
    (grad,) = lockstep.run([custom])
    assert (lockstep.stacked_batch_gradients, lockstep.sequential_gradients) == (0, 1)
    torch.testing.assert_close(grad, custom(w), rtol=0, atol=0)
    data = w.data
    bn = ClientTrainer(_bn_net(data.x[0].numel()), data, TrainSettings(batch_size=16), seed=0)
    assert not StackedTrainer(bn).stacks_method_passes
    lockstep = Lockstep(bn, StackedTrainer(bn))
    lockstep.run([_own_loop(0, bn.flat.snapshot())])
    calls = 2 * len(list(bn.batches(0, 0, "own", 2)))
    assert lockstep.stacked_batch_gradients == 0 and lockstep.sequential_gradients == calls > 0
