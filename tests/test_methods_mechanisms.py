"""The general pieces methods build on: layer slices, Freeze, custom losses, mean gradients, and the
method API's own contracts (uploads, contexts, defaults a user method inherits)."""

from __future__ import annotations

import contextlib
import io
import math
import time
import types

import pytest
import torch
import torch.nn.functional as F
from torch.func import functional_call

from pfl.cli import list_methods
from pfl.data import DataConfig, build_data
from pfl.engine.flat import FlatModule, ModelLayout
from pfl.engine.terms import Freeze
from pfl.engine.worker import FitSpec, TrainSettings, Worker
from pfl.methods import Method, Upload, register, stores
from pfl.methods import reports as reports_module
from pfl.methods.base import ClientContext, ServerContext, train_settings, weighted_mean
from pfl.methods.registry import _REGISTRY
from pfl.metrics.comm import nbytes
from pfl.models import ModelConfig, build_model
from tests.conftest import make_loop, tiny_config


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
    return Worker(net, data, TrainSettings(**{"epochs": 1, "batch_size": 16, "lr": 0.1, **settings}), seed=0)


def test_freeze_keeps_a_slice_exact_under_momentum_and_weight_decay():
    w = _worker(momentum=0.9, weight_decay=0.1)
    start = w.snapshot()
    head = w.flat.layout.tail(1)
    w.fit(0, start, 0, FitSpec(epochs=2, terms=[Freeze(start[: w.flat.num_params], head)]))
    out = w.snapshot()
    assert torch.equal(out[head], start[head])
    assert not torch.equal(out[: head.start], start[: head.start])


def test_custom_loss_replaces_the_data_term():
    w = _worker()
    start = w.snapshot()
    w.fit(0, start, 0, FitSpec(loss_fn=lambda net, x, y: 0.0 * net(x).sum()))  # a loss with zero gradient
    assert torch.equal(w.snapshot(), start)
    w.fit(0, start, 0)  # and the default comes back afterwards
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


# -- the method API's own contracts (pfl/methods/base.py) --------------------------------------------
def _api_loop(name: str = "fedavg"):
    return make_loop(tiny_config(name))


def test_an_empty_upload_carries_nothing_and_counts_no_bytes():

    a, b = Upload(), Upload()
    assert a.state is None and a.weight == 0.0 and a.extras == {} and "loss" not in a
    assert a.extras is not b.extras  # each upload its own dict
    assert nbytes(a) == 0


def test_server_context_defaults_and_the_callables_it_does_not_show():
    layout = _api_loop().worker.flat.layout
    init = torch.zeros(layout.num_params + layout.num_buffers)
    a = ServerContext(0, 4, 2, layout, init)
    b = ServerContext(0, 4, 2, layout, init, evaluator=lambda s: None, client_loss=lambda c, s: 0.0)
    assert a.state == {} and a.state is not b.state and a.seed == 0
    assert "evaluator" not in repr(b) and "client_loss" not in repr(b) and "seed=0" in repr(b)
    assert "reports" not in repr(a) and a.reports is not b.reports  # each server its own sums
    with pytest.raises(RuntimeError, match="no global test set"):
        a.evaluate(init)
    with pytest.raises(RuntimeError, match="cannot ask clients"):
        a.ask_loss(0, init)


def _ticking_clock(monkeypatch, step: float = 1.0) -> None:
    """perf_counter returns 0, step, 2·step, ...: a timed block takes one step."""
    clock = iter(range(10_000))
    monkeypatch.setattr(reports_module, "time", types.SimpleNamespace(perf_counter=lambda: step * next(clock)))


def _bare_server(p: int = 3) -> ServerContext:
    layout = ModelLayout(p, 0, (("0", slice(0, p)),), torch.device("cpu"))
    return ServerContext(0, 4, 2, layout, torch.zeros(p, dtype=torch.float64))


def test_server_timed_adds_seconds_per_phase_and_round_and_take_resets(monkeypatch):
    _ticking_clock(monkeypatch, 2.0)
    server = _bare_server()
    for r in (3, 4):
        server.round = r
        with server.timed("solve"):
            pass
        with server.timed("solve"):
            pass
    server.round = 5
    with pytest.raises(ValueError), server.timed("search"):  # a block that raises still counts
        raise ValueError
    times = server.take_times()
    assert times.seconds == {"solve": 8.0, "search": 2.0} and times.counts == {"solve": 4, "search": 1}
    assert times.rounds == 3  # rounds 3, 4 and 5, each counted once however many blocks ran in it
    assert times.per_round("m") == {"time.m.solve_s_per_round": 8.0 / 3, "time.m.search_s_per_round": 2.0 / 3}
    assert server.take_times() == reports_module.Times()  # reset by the take
    assert reports_module.Times({"x": 1.0}, {"x": 1}, 0).per_round("m") == {}  # no round: no per-round mean


def test_client_side_phases_join_the_servers_and_its_rounds(monkeypatch):
    _ticking_clock(monkeypatch)
    server, method = _bare_server(), Method()
    with server.timed("solve"):
        pass
    for _ in range(3):
        with method.timed("client"):
            pass
    with method.timed("solve"):  # a phase timed on both sides adds up
        pass
    assert method.metrics(server) == {"time..solve_s_per_round": 2.0, "time..client_s_per_round": 3.0}
    assert method.metrics(server) == {}  # both sides reset
    with method.timed("client"):
        pass
    assert method.metrics(server) == {}  # client time without a server round has no per-round mean
    assert Method().take_times(server).seconds == {}  # each method its own client-side sums


def test_ask_loss_counts_its_own_exchange_and_take_bytes_resets():
    server = _bare_server(5)
    asked = []
    server.client_loss = lambda cid, state: asked.append((cid, state.clone())) or 0.5
    state = torch.ones(5, dtype=torch.float64)
    assert server.ask_loss(2, state) == 0.5 and torch.equal(asked[0][1], state) and asked[0][0] == 2
    assert server.take_bytes() == (4, 5 * 8)  # one 32-bit loss up, the float64 state down
    assert server.take_bytes() == (0, 0)
    server.ask_loss(0, state, sent=4)  # the client rebuilds the state from one number it is sent
    server.ask_loss(1, state, sent=0)
    server.count_bytes(down=7)
    server.count_bytes(up=3)
    assert Method().comm_extra(server) == (4 + 4 + 3, 4 + 0 + 7)  # the base hook drains the server's counts
    assert server.take_bytes() == (0, 0)


def test_client_context_keeps_momentum_under_the_purposes_key_and_hides_the_worker():
    loop = _api_loop()
    ctx = loop.client(0)
    assert "worker" not in repr(ctx)
    start = loop.server["global"]
    ctx.fit(start, momentum=0.9, keep_momentum=True)
    assert set(ctx.state) == {"momentum"}
    ctx.fit(start, momentum=0.9, keep_momentum=True, purpose="finetune")
    assert set(ctx.state) == {"momentum", "momentum.finetune"}
    kept = ctx.state["momentum"].clone()
    ctx.fit(start, momentum=0.9, purpose="finetune")  # keep_momentum None: only "train" fits keep it
    assert torch.equal(ctx.state["momentum"], kept)


def test_record_fit_counts_the_samples_of_every_epoch():
    ctx = _api_loop().client(0)
    started = time.perf_counter()
    ctx.record_fit(steps=3, epochs=2, started=started)
    (fit,) = ctx.fits
    assert fit.samples_seen == 2 * ctx.num_samples and fit.steps == 3 and math.isnan(fit.loss)
    assert 0 <= fit.seconds < 60


def test_method_defaults_a_user_method_inherits():
    class Bare(Method):  # no description, no set_client_optimizer
        name = "_bare_for_test"

    assert Bare.client_momentum is None and Bare.keep_momentum is None
    cfg = tiny_config("fedavg", client={"momentum": 0.5, "keep_momentum": True})
    settings = train_settings(cfg.client, Bare())
    assert settings.momentum == 0.5 and settings.keep_momentum is True  # the run's settings apply
    assert Bare().comm_extra(_bare_server()) == (0, 0) and Bare().metrics(_bare_server()) == {}
    register(Bare)
    try:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            list_methods()
        (line,) = [row for row in out.getvalue().splitlines() if row.startswith("_bare_for_test")]
        assert line.rstrip() == "_bare_for_test"  # an empty description, not "None"
    finally:
        _REGISTRY.pop("_bare_for_test", None)


def test_personal_state_is_the_clients_own_model_unless_the_method_has_only_a_global_one():
    loop = _api_loop()
    ctx = loop.client(0)
    ctx.state["personal"] = torch.full_like(loop.server["global"], 3.0)

    class Both(Method):
        name = "both"

    class GlobalOnly(Method):
        name = "global_only"
        has_personal_model = False

    class Neither(Method):
        name = "neither"
        has_personal_model = has_global_model = False

    assert Both().personal_state(loop.server, ctx) is ctx.state["personal"]
    assert GlobalOnly().personal_state(loop.server, ctx) is loop.server["global"]
    assert Neither().personal_state(loop.server, ctx) is ctx.state["personal"]


def test_default_new_client_adaptation_fine_tunes_the_global_model_or_the_initial_one():
    loop = _api_loop()
    loop.run_round()
    new = ClientContext(1, loop.round, loop.worker, {}, loop.init_state)
    assert loop.method.adapt_new_client(loop.server, new, 0) is loop.server["global"]
    tuned = loop.method.adapt_new_client(loop.server, new, 1)
    assert not torch.equal(tuned, loop.server["global"]) and new.fits[-1].samples_seen == new.num_samples
    local = _api_loop("local")
    assert local.method.adapt_new_client(local.server, new, 0) is loop.init_state


def test_hparams_are_the_init_arguments_in_method_resolution_order():
    class Base(Method):
        def __init__(self, x=1):
            self.x = x

    class Left(Base):  # no __init__ of its own
        pass

    class Right(Base):
        def __init__(self, b=2, **extra):
            super().__init__()
            self.b, self.extra = b, extra  # **extra is not a hyper-parameter

    class Diamond(Left, Right):
        def __init__(self, c=3):
            super().__init__()
            self.c = c

    assert list(Diamond().hparams()) == ["c", "b", "x"]


def test_weighted_mean_refuses_vectors_and_weights_of_different_lengths():
    v = torch.ones(3)
    torch.testing.assert_close(weighted_mean([v, 3 * v], [1.0, 3.0]), 2.5 * v)
    with pytest.raises(ValueError):
        weighted_mean([v, v], [1.0])


# -- per-client model stores: Gram geometry without copies (pfl/methods/stores.py) ---------------------
def test_row_gram_is_the_centred_float64_gram_over_column_blocks():
    g = torch.Generator().manual_seed(0)
    store = torch.randn(3, stores._BLOCK + 1000, generator=g)  # two column blocks, the second partial
    center = torch.randn(store.shape[1], generator=g)
    rows = store.double() - center.double()
    torch.testing.assert_close(stores.row_gram(store, center), rows @ rows.T, rtol=1e-12, atol=1e-9)
    torch.testing.assert_close(stores.row_gram(store), store.double() @ store.double().T, rtol=1e-12, atol=1e-9)
    first = store[:, :700].double()
    torch.testing.assert_close(stores.row_gram(store, cols=700), first @ first.T, rtol=1e-12, atol=1e-9)
    assert stores.row_gram(store).dtype == torch.float64


def test_squared_distances_and_clipped_cosine_from_a_gram_matrix():
    rows = torch.tensor([[1.0, 0.0], [0.0, 2.0], [-3.0, 0.0], [0.0, 0.0]], dtype=torch.float64)
    gram = rows @ rows.T
    dist = stores.squared_distances(gram)
    torch.testing.assert_close(dist, torch.cdist(rows, rows) ** 2)
    assert torch.equal(dist.diagonal(), torch.zeros(4, dtype=torch.float64))
    # rounding can make G_ii + G_jj - 2 G_ij slightly negative for (nearly) equal rows: clamped at 0
    near = torch.tensor([[1.0, 1.0 + 2**-52], [1.0 + 2**-52, 1.0]], dtype=torch.float64)
    assert torch.equal(stores.squared_distances(near), torch.zeros(2, 2, dtype=torch.float64))
    cos = stores.clipped_cosine(gram)
    expected = torch.tensor(
        [[1.0, 0.0, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0], [0.0, 0.0, 0.0, 1.0]], dtype=torch.float64
    )  # orthogonal: 0; opposite (cos -1): clipped to 0; the zero row: 0 with the others, 1 with itself
    torch.testing.assert_close(cos, expected)
    parallel = torch.tensor([[1.0, 1.0, 1.0], [3.0, 3.0, 3.0]], dtype=torch.float64)  # cos rounds to 1 + 2^-52
    assert torch.equal(stores.clipped_cosine(parallel @ parallel.T), torch.ones(2, 2, dtype=torch.float64))
    skew = torch.tensor([[3.0, 4.0], [4.0, 3.0]], dtype=torch.float64)
    for scale in (1.0, 1e-3):  # scale-free: rows of norm below 1 too
        cos_skew = stores.clipped_cosine((scale * skew) @ (scale * skew).T)[0, 1]
        torch.testing.assert_close(cos_skew, torch.tensor(24.0 / 25.0, dtype=torch.float64))
