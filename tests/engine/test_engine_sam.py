"""SAM-family local steps in the engine (pfl.engine.sam): the two passes inside a worker's fit."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call

from pfl.data import DataConfig, build_data
from pfl.engine.sam import SAMObjective, sam_context
from pfl.engine.terms import Proximal
from pfl.engine.trainer import ClientTrainer, FitSpec, TrainSettings
from pfl.optim.sharpness import layer_scale

RHO = 0.05


def _worker(net: nn.Module | None = None, batch_size: int = 1000, **settings) -> ClientTrainer:
    data = build_data(DataConfig(source="digits", num_clients=4, alpha=0.5, min_samples=20), 0)
    torch.manual_seed(0)
    net = net or nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.Tanh(), nn.Linear(16, 10))
    return ClientTrainer(net, data, TrainSettings(epochs=1, batch_size=batch_size, lr=0.1, **settings), seed=0)


def _only_batch(worker: ClientTrainer, cid: int = 0) -> tuple[Tensor, Tensor]:
    (b,) = list(worker.batches(cid, 0, "train", 1))  # batch_size >= n: one step per epoch
    return worker.data.x[b], worker.data.y[b]


def _grad_at(worker: ClientTrainer, params: Tensor, x: Tensor, y: Tensor) -> Tensor:
    p = params.detach().clone().requires_grad_(True)
    loss = F.cross_entropy(functional_call(worker.module.net, worker.flat.param_dict(p), (x,)), y)
    return torch.autograd.grad(loss, p)[0]


def _fit(worker: ClientTrainer, objective=None, context=None, terms=(), cid: int = 0) -> Tensor:
    start = worker.snapshot()
    worker.train(cid, start, 0, FitSpec(terms=terms, objective=objective, context=context))
    trained = worker.snapshot()
    worker.flat.load(start)
    return trained


class Recording(SAMObjective):
    """Records the parameters at every forward and the flat gradient on entry to every backward."""

    def __init__(self, net: nn.Module, task: str = "classification"):
        super().__init__(net, task)
        self.params_seen: list[Tensor] = []
        self.grads_seen: list[Tensor] = []

    def batch_loss(self, x: Tensor, y: Tensor) -> Tensor:
        self.params_seen.append(self.flat.params.detach().clone())
        return super().batch_loss(x, y)

    def backward_at_current(self, x: Tensor, y: Tensor) -> Tensor:
        self.grads_seen.append(self.flat.grads.detach().clone())
        return super().backward_at_current(x, y)


@pytest.mark.parametrize("settings", [{}, {"momentum": 0.9, "weight_decay": 1e-3}])
def test_sam_with_rho_zero_is_sgd_bit_for_bit(settings):
    worker = _worker(batch_size=16, **settings)  # several steps, so momentum carries over
    sgd = _fit(worker)
    sam = _fit(worker, SAMObjective, sam_context(0.0))
    assert torch.equal(sgd, sam)
    assert not torch.equal(sgd, _fit(worker, SAMObjective, sam_context(RHO)))


def test_sam_step_equals_a_hand_computation_and_composes_with_terms():
    worker = _worker()
    w = worker.flat.params.detach().clone()
    anchor = w + 0.3
    x, y = _only_batch(worker)
    trained = _fit(worker, SAMObjective, sam_context(RHO), terms=[Proximal(anchor, 0.5)])
    g = _grad_at(worker, w, x, y)
    eps = RHO * g / g.norm()
    g_sam = _grad_at(worker, w + eps, x, y) + 0.5 * (w - anchor)  # the term is evaluated at w, not w + ε
    expected = w - 0.1 * g_sam
    torch.testing.assert_close(trained[: w.numel()], expected, rtol=0, atol=1e-6)
    assert (expected - (w - 0.1 * (_grad_at(worker, w, x, y) + 0.5 * (w - anchor)))).abs().max() > 1e-4


def test_epsilon_inside_the_step_has_norm_rho_along_the_gradient():
    worker = _worker()
    x, y = _only_batch(worker)
    w = worker.flat.params.detach().clone()
    _fit(worker, Recording, sam_context(RHO))
    rec = worker.objective(Recording)
    assert len(rec.params_seen) == 2  # one step: the pass at w, the pass at w + ε
    eps = rec.grads_seen[1]  # ε, formed in place in the gradient, as the second backward found it
    assert math.isclose(float(eps.norm()), RHO, rel_tol=1e-6)
    g = _grad_at(worker, w, x, y)
    torch.testing.assert_close(eps, RHO * g / g.norm(), rtol=1e-5, atol=1e-8)
    torch.testing.assert_close(rec.params_seen[0], w, rtol=0, atol=0)
    torch.testing.assert_close(rec.params_seen[1] - rec.params_seen[0], eps, rtol=0, atol=1e-7)


def test_per_layer_epsilon_follows_lambda_and_the_region():
    worker = _worker()
    x, y = _only_batch(worker)
    w = worker.flat.params.detach().clone()
    layers = list(worker.flat.layout.layer_slices().values())
    xi = torch.tensor([0.2, 0.8])
    _fit(worker, Recording, sam_context(RHO, scale=layer_scale(xi, layers, w.numel())))
    rec = worker.objective(Recording)
    eps = rec.grads_seen[-1]
    g = _grad_at(worker, w, x, y)
    for sl, s in zip(layers, xi.tolist(), strict=True):
        assert math.isclose(float(eps[sl].norm()), RHO * s * float(g[sl].norm() / g.norm()), rel_tol=1e-5)
    # a region: ε and the norm that normalises it cover the body only; the head is not perturbed
    body = slice(0, layers[-1].start)
    _fit(worker, Recording, sam_context(RHO, region=body))
    eps = rec.grads_seen[-1]
    assert math.isclose(float(eps[body].norm()), RHO, rel_tol=1e-6)
    torch.testing.assert_close(rec.params_seen[-1][layers[-1]], w[layers[-1]], rtol=0, atol=0)
    torch.testing.assert_close(eps[body], RHO * g[body] / g[body].norm(), rtol=1e-5, atol=1e-8)


def test_the_perturbed_pass_leaves_no_trace_in_batchnorm_statistics():
    net = nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 10))
    worker = _worker(net)
    n = worker.flat.num_params
    sgd, sam = _fit(worker), _fit(worker, SAMObjective, sam_context(RHO))
    assert not torch.equal(sgd[:n], sam[:n])
    assert torch.equal(sgd[n:], sam[n:])  # one step: both statistics come from the one forward at w


def test_sam_context_rejects_bad_values():
    with pytest.raises(ValueError, match="rho"):
        sam_context(-0.1)
    with pytest.raises(ValueError, match="p must"):
        sam_context(0.05, p=0.5)
    with pytest.raises(ValueError, match="region"):
        sam_context(0.05, region=slice(0, None))
