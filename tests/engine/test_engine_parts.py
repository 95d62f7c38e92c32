"""The engine pieces methods build on: layer slices, functional forwards, Freeze, custom losses, mean
gradients. The method API's own contracts are tested in tests/methods/test_base.py."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.func import functional_call

from pfl.data import DataConfig, build_data
from pfl.engine.flat import FlatModule
from pfl.engine.terms import Freeze
from pfl.engine.trainer import ClientTrainer, FitSpec, TrainSettings
from pfl.models import ModelConfig, build_model


def _cnn_flat():
    net = build_model(ModelConfig(name="cnn", channels=[4, 8], kernel=3, padding=1, fc=16), (1, 8, 8), 10)
    return net, FlatModule(net)


def test_layer_slices_follow_the_modules_and_the_head_is_the_last_linear():
    net, flat = _cnn_flat()
    layers = flat.layout.layer_slices()
    assert list(layers) == ["0.0", "0.3", "1", "3"]  # conv, conv, fc, classifier
    head = flat.layout.tail(1)
    assert head.stop - head.start == net[3].weight.numel() + net[3].bias.numel()
    assert torch.equal(flat.params[head], torch.cat([net[3].weight.reshape(-1), net[3].bias]))
    assert flat.layout.tail(0).start == flat.num_params and flat.layout.tail(4).start == 0
    assert int(flat.layout.state_mask(head).sum()) == head.stop - head.start


def test_param_dict_drives_a_functional_forward():
    net, flat = _cnn_flat()
    x = torch.randn(3, 1, 8, 8)
    with torch.no_grad():
        same = functional_call(net, flat.param_dict(flat.params.clone()), (x,))
        torch.testing.assert_close(same, net(x))
        zero = functional_call(net, flat.param_dict(torch.zeros_like(flat.params)), (x,))
    assert torch.count_nonzero(zero) == 0


def _worker(**settings):
    data = build_data(DataConfig(source="digits", num_clients=2, alpha=1.0, min_samples=20), 0)
    net = build_model(ModelConfig(name="mlp", hidden=[16]), data.input_shape, data.num_classes)
    return ClientTrainer(net, data, TrainSettings(**{"epochs": 1, "batch_size": 16, "lr": 0.1, **settings}), seed=0)


def test_freeze_keeps_a_slice_exact_under_momentum_and_weight_decay():
    w = _worker(momentum=0.9, weight_decay=0.1)
    start = w.snapshot()
    head = w.flat.layout.tail(1)
    w.train(0, start, 0, FitSpec(epochs=2, terms=[Freeze(start[: w.flat.num_params], head)]))
    out = w.snapshot()
    assert torch.equal(out[head], start[head])
    assert not torch.equal(out[: head.start], start[: head.start])


def test_custom_loss_replaces_the_data_term():
    w = _worker()
    start = w.snapshot()
    w.train(0, start, 0, FitSpec(loss_fn=lambda net, x, y: 0.0 * net(x).sum()))  # a loss with zero gradient
    assert torch.equal(w.snapshot(), start)
    w.train(0, start, 0)  # and the default comes back afterwards
    assert not torch.equal(w.snapshot(), start)


def test_mean_gradient_is_the_mean_of_batch_gradients_in_index_order():
    w = _worker(batch_size=7)
    state = w.snapshot()
    idx = w.data.clients[1].train
    params = state[: w.flat.num_params].clone().requires_grad_(True)
    grads, losses = [], []
    for s in range(0, len(idx), 7):
        b = idx[s : s + 7]
        loss = F.cross_entropy(functional_call(w.module.net, w.flat.param_dict(params), (w.data.x[b],)), w.data.y[b])
        grads.append(torch.autograd.grad(loss, params)[0])
        losses.append(float(loss.detach()) * len(b))
    g, f = w.mean_gradient(1, state)
    torch.testing.assert_close(g, torch.stack(grads).mean(0), rtol=1e-5, atol=1e-7)
    assert abs(f - sum(losses) / len(idx)) < 1e-5


@pytest.mark.parametrize("drop_last", [False, True])
def test_batches_per_epoch_counts_what_keyed_batches_draws(drop_last):
    from pfl.engine.fit_spec import batches_per_epoch, keyed_batches

    for n in (1, 4, 5, 9, 10, 11, 16):
        drawn = list(keyed_batches(torch.Generator().manual_seed(0), torch.arange(n), 2, 5, drop_last))
        assert [e for e, _ in drawn].count(0) == [e for e, _ in drawn].count(1) == batches_per_epoch(n, 5, drop_last)
        kept = sum(len(b) for e, b in drawn if e == 0)
        assert kept == (n if not drop_last or n < 5 else n - n % 5), (n, drop_last)


def test_client_module_still_imports_from_the_path_the_docs_gave():
    from pfl.engine import trainer, worker

    assert worker.ClientModule is trainer.ClientModule and worker.__all__ == ["ClientModule"]
