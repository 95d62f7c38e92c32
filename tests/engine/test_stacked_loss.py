"""Custom losses trained stacked (``pfl.engine.stacked_loss``): each client's extra tensor, constants and
SGD settings, against the worker's sequential fit with the same ``loss_fn``. The registry's custom-loss
methods (APFL, FedRoD, SplitGP) are compared whole in ``test_lockstep_real_runs.py``."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F

from pfl.data import DataConfig
from pfl.engine.fit_spec import FitSpec
from pfl.engine.lockstep import Lockstep
from pfl.engine.stacked import FitRequest, StackedTrainer, spec_problem
from pfl.engine.stacked_loss import ParamsAt, StackedLoss
from pfl.engine.terms import ExtraParamSGD, Proximal
from pfl.engine.trainer import ClientTrainer, TrainSettings
from pfl.federation.dispatch import VectorizedDispatcher
from tests.conftest import make_loop, tiny_config
from tests.engine.test_stacked import _bn_net, _dropout_net, _sequential, _worker
from tests.helpers.same_runs import assert_close


@dataclass(frozen=True)
class ShiftedLoss:
    """Cross-entropy of the model's logits plus a trained bias ``e`` scaled by the client's ``shift``."""

    def __call__(self, at: ParamsAt, p, e, x, y, shift):
        return F.cross_entropy(at(p, x) + e * shift, y, reduction="none")


def _spec(
    k: int, e: torch.Tensor, shift: torch.Tensor, buf: torch.Tensor | None, anchor: torch.Tensor, one: torch.Tensor
) -> FitSpec:
    """Client k's fit: its own extra lr (None: the fit's), momentum, weight decay, kept buffer, epochs;
    client 0 trains on ``one`` sample (a batch of one: its mean is that sample's loss)."""
    term = ExtraParamSGD(e, lr=(None, 0.02, 0.3, None)[k], momentum=(0.0, 0.5, 0.9, 0.9)[k],
                         weight_decay=(0.0, 1e-2, 1e-3, 0.0)[k])  # fmt: skip
    term.buf = None if buf is None else buf.clone()

    def loss_fn(net, x, y):
        return F.cross_entropy(net(x) + e * shift, y)

    return FitSpec(
        epochs=(1, 2, 3, 0)[k],
        lr=(0.1, 0.05, 0.1, 0.1)[k],
        terms=[Proximal(anchor, 0.1), term],
        loss_fn=loss_fn,
        stacked_loss=StackedLoss(ShiftedLoss(), term, (shift,)),
        indices=one if k == 0 else None,
    )


def test_custom_loss_fits_stack_as_the_workers_fits_each_with_its_extra_tensor_settings_and_constants():
    w = _worker().worker
    start = w.flat.snapshot()
    p = w.flat.num_params
    g = torch.Generator().manual_seed(0)
    extras = [0.1 * torch.randn(10, generator=g) for _ in range(4)]
    shifts = [torch.rand(10, generator=g) + 0.5 for _ in range(4)]
    bufs = [None, None, 0.1 * torch.randn(10, generator=g), torch.ones(10)]  # kept momentum, one never stepped
    anchor = start[:p] + 0.05 * torch.randn(p, generator=g)

    one = w.split(0).train[:1]

    def specs() -> list[FitSpec]:
        fresh = [e.clone().requires_grad_(True) for e in extras]
        return [_spec(k, fresh[k], shifts[k], bufs[k], anchor, one) for k in range(4)]

    seq = specs()
    expected = [_sequential(w, k, start, s) for k, s in enumerate(seq)]
    plain = FitSpec(terms=[Proximal(anchor, 0.1)])  # the same terms, the default loss: another group
    expected.append(_sequential(w, 4, start, plain))
    stacked = specs()
    assert all(spec_problem(s) is None for s in stacked)
    requests = [FitRequest.of(w, k, start, 0, s) for k, s in enumerate([*stacked, plain])]
    assert len({r.group() for r in requests[:4]}) == 1 and all(len(r.terms) == 1 for r in requests)
    assert requests[4].group() != requests[0].group()
    trainer = StackedTrainer(w)
    trainer.train([requests[0], *requests[2:]])  # with a fit of the default loss beside them
    trainer.train(requests[1:2])  # a group of one
    for k, r in enumerate(requests[:4]):
        state, momentum, stats = expected[k]
        torch.testing.assert_close(r.out, state, rtol=0, atol=1e-5)
        assert r.stats.steps == stats.steps and r.stats.loss == pytest.approx(stats.loss, abs=1e-5, nan_ok=True)
        a, b = seq[k].stacked_loss.extra, stacked[k].stacked_loss.extra
        torch.testing.assert_close(b.tensor.detach(), a.tensor.detach(), rtol=0, atol=1e-6)
        if a.buf is None:
            assert b.buf is None, k
        else:
            torch.testing.assert_close(b.buf, a.buf, rtol=0, atol=1e-6)
    torch.testing.assert_close(requests[4].out, expected[4][0], rtol=0, atol=1e-5)
    assert requests[0].stats.steps == 1  # one batch, of one sample
    assert not torch.equal(stacked[2].stacked_loss.extra.tensor, extras[2])  # the extra tensors trained
    assert torch.equal(stacked[3].stacked_loss.extra.buf, torch.ones(10))  # no step: its buffer as it was


def test_a_stacked_loss_stacks_only_beside_the_loss_and_the_term_it_restates():
    e = torch.zeros(3, requires_grad=True)
    term = ExtraParamSGD(e)
    custom = StackedLoss(ShiftedLoss(), term, (torch.ones(3),))

    def loss_fn(net, x, y):
        return net(x).sum()

    assert spec_problem(FitSpec(loss_fn=loss_fn, terms=[term])) == "a custom loss (loss_fn)"
    assert spec_problem(FitSpec(loss_fn=loss_fn, terms=[term], stacked_loss=custom)) is None
    for spec in (FitSpec(terms=[term], stacked_loss=custom), FitSpec(loss_fn=loss_fn, stacked_loss=custom)):
        assert spec_problem(spec).startswith("a stacked loss (stacked_loss) without the loss_fn")
    other = ExtraParamSGD(torch.zeros(3, requires_grad=True))  # a second extra tensor: no stacked form
    assert "ExtraParamSGD" in spec_problem(FitSpec(loss_fn=loss_fn, terms=[term, other], stacked_loss=custom))
    # per_sample callables that compare equal group together, with the extra tensor's and constants' shapes
    assert custom.group_key() == (ShiftedLoss(), (3,), (3,))
    assert StackedLoss(ShiftedLoss(), ExtraParamSGD(torch.zeros(4)), (torch.ones(4),)).group_key() == (
        ShiftedLoss(), (4,), (4,))  # fmt: skip


@pytest.mark.parametrize("net", ["batch_norm", "keyed_dropout"])
def test_models_with_running_statistics_or_keyed_dropout_train_custom_losses_on_the_worker(net):
    data = _worker().worker.data
    dim = data.x[0].numel()
    model = _bn_net(dim) if net == "batch_norm" else _dropout_net(dim, batch_norm=False)
    w = ClientTrainer(model, data, TrainSettings(batch_size=16), seed=0)
    lockstep = Lockstep(w, StackedTrainer(w))
    term = ExtraParamSGD(torch.zeros(10, requires_grad=True))
    spec = FitSpec(loss_fn=lambda n, x, y: n(x).sum(), terms=[term], stacked_loss=StackedLoss(ShiftedLoss(), term))
    assert lockstep.stacks(FitSpec()) and not lockstep.stacks(spec)
    plain = _worker().worker
    assert Lockstep(plain, StackedTrainer(plain)).stacks(spec)


REGRESSION = {
    "data": DataConfig(source="synthetic_regression", num_clients=6, val_frac=0.2, test_frac=0.3),
    "model": {"name": "mlp", "hidden": [16]},
    "client": {"lr": 0.01, "momentum": 0.5},
}
# momentum kept across rounds (each method's extra tensor's buffer too), weight decay, augmentation
CLASSIFICATION = {"client": {"momentum": 0.5, "keep_momentum": True, "weight_decay": 1e-3},
                  "data": {"augment": "flip", "max_client_samples": 90}}  # fmt: skip


@pytest.mark.parametrize(
    ("name", "args", "groups"),
    [
        ("apfl", {"mix": 0.5}, REGRESSION),  # (B, 1) outputs squeezed to the targets, as in loss_fn
        ("splitgp", {}, REGRESSION),
        ("apfl", {"mix": 0.3}, CLASSIFICATION),
        ("fedrod", {"head_lr": 0.05}, CLASSIFICATION),
        ("splitgp", {"lam": 0.4}, CLASSIFICATION),
    ],
)
def test_the_registrys_custom_losses_stack_as_they_train_sequentially(name, args, groups):
    seq, vec = (make_loop(tiny_config(name, args, trainer={"rounds": 2, "eval_every": 2}, **groups)) for _ in range(2))
    vec.dispatcher = VectorizedDispatcher(vec.worker, vec.clients, vec.init_state, vec.evals.trained, False)
    seq.fit(), vec.fit()
    assert vec.dispatcher.lockstep.stacked_fits == 12 and vec.dispatcher.lockstep.sequential_fits == 0
    assert_close(vec.server.state, seq.server.state, "server")
    assert_close(dict(vec.clients.items()), dict(seq.clients.items()), "clients")
