"""Tests of pfl/methods/plgu.py (PLGU-LF, PLGU-GRep), and the properties PLGU's paper checks over its whole
family (FedSAM, PLGU-LF, PLGU-GRep, pFedHN, PLGU-GHN): identities and one-step hand computations.

Which identities hold bit for bit (torch.equal) and which to a tolerance:
- FedSAM with ρ = 0 = FedAvg: bit for bit.
- PLGU-LF with every layer personal = FedAvg (global model): bit for bit.
- PLGU-LF with D = 0, Λ = I and the ascent at the global copy = FedSAM: bit for bit.
- PLGU-GRep (default: no Eq. 11 step) with ρ = 0 = FedRep: bit for bit.
- PLGU-GHN with ρ = 0 = pFedHN: bit for bit.
- One step of PLGU-LF / PLGU-GRep and one round of pFedHN against a hand computation: 1e-6
  (the hand computation sums in another order).
"""

from __future__ import annotations

import copy
import warnings
from pathlib import Path

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from lightning.fabric.plugins.precision import MixedPrecision
from torch import Tensor
from torch.func import functional_call

from pfl.data import DataConfig
from pfl.errors import ConfigError
from pfl.federation.loop import FederatedLoop
from pfl.methods import method_class
from pfl.methods.plgu import PLGULF, buffer_slices, buffer_views
from pfl.models import ModelConfig
from pfl.runner.args import parse_fit_args
from tests.conftest import make_loop, tiny_config
from tests.methods.helpers import SAM_HALF as HALF
from tests.methods.helpers import SAM_MOMENTUM as MOMENTUM
from tests.methods.helpers import equal_servers as _equal_servers
from tests.methods.helpers import fit_half_momentum as _fit

ONE_BATCH = {"batch_size": 1000, "epochs": 1, "lr": 0.1}


RHO = 0.05


METHODS = ("fedsam", "plgu_lf", "plgu_grep", "pfedhn", "plgu_ghn")


CONF = Path(__file__).resolve().parents[2] / "conf"


PLGU_METHODS = ("fedsam", "plgu_lf", "plgu_grep", "pfedhn", "pfedhn_official", "plgu_ghn")


def _same_metrics(a: FederatedLoop, b: FederatedLoop, prefixes: tuple[str, ...] = ("",)) -> bool:
    """Equal metrics (those starting with one of ``prefixes``), timings aside."""
    ma, mb = a.evaluate(), b.evaluate()
    keys = [k for k in ma if k.startswith(prefixes) and not k.startswith(("throughput.", "time."))]
    return ma.keys() == mb.keys() and all(ma[k] == mb[k] for k in keys)


def _grad_at(loop: FederatedLoop, params: Tensor, x: Tensor, y: Tensor, region: slice | None = None) -> Tensor:
    p = params.detach().clone().requires_grad_(True)
    loss = F.cross_entropy(functional_call(loop.worker.module.net, loop.flat.param_dict(p), (x,)), y)
    g = torch.autograd.grad(loss, p)[0]
    if region is not None:  # a frozen part has no gradient
        mask = torch.zeros_like(g, dtype=torch.bool)
        mask[region] = True
        g = torch.where(mask, g, torch.zeros_like(g))
    return g


def _only_batch(loop: FederatedLoop, cid: int, purpose: str = "train") -> tuple[Tensor, Tensor]:
    (b,) = list(loop.worker.batches(cid, loop.round, purpose, 1))
    return loop.worker.data.x[b], loop.worker.data.y[b]


@pytest.mark.parametrize("d", [2, 5])  # the tiny MLP has 2 layers; a larger D personalizes them all
def test_plgu_lf_with_every_layer_personal_is_fedavg(d):
    fedavg, lf = _fit("fedavg"), _fit("plgu_lf", {"personal_layers": d})
    assert torch.equal(fedavg.server["global"], lf.server["global"])
    a, b = fedavg.evaluate(), lf.evaluate()
    assert all(a[k] == b[k] for k in a if k.startswith("gm.l_acc"))


def test_plgu_lf_with_no_personal_layer_is_fedsam_with_identity_scale_and_global_ascent():
    fedsam = _fit("fedsam")
    exact = _fit("plgu_lf", {"personal_layers": 0, "scale": "identity", "ascent": "global"})
    assert torch.equal(fedsam.server["global"], exact.server["global"])
    for args in ({"scale": "layer", "ascent": "global"}, {"scale": "identity", "ascent": "personal"}):
        near = _fit("plgu_lf", {"personal_layers": 0, **args})  # the paper's choices: FedSAM-like only
        assert not torch.equal(fedsam.server["global"], near.server["global"])


def test_plgu_grep_default_with_rho_zero_is_fedrep():
    fedrep = _fit("fedrep", {"head_epochs": 2})
    grep = _fit("plgu_grep", {"head_epochs": 2, "rho": 0.0})
    assert torch.equal(fedrep.server["global"], grep.server["global"])
    assert fedrep.evaluate()["pm.l_acc.mean"] == grep.evaluate()["pm.l_acc.mean"]
    assert not torch.equal(fedrep.server["global"], _fit("plgu_grep", {"head_epochs": 2}).server["global"])
    # Eq. 11's extra step is what separates the pre_step option from FedRep at ρ = 0
    extra = _fit("plgu_grep", {"head_epochs": 2, "rho": 0.0, "pre_step": True})
    assert not torch.equal(fedrep.server["global"], extra.server["global"])


@pytest.mark.parametrize(
    ("args", "steps", "passes"),
    [
        ({}, 1, 2),  # Algorithm 3: one update of φ̃ per body mini-batch, the LWSAM step (ascent + descent pass)
        ({"rho": 0.0}, 1, 1),  # ε ≡ 0: FedRep's plain step
        ({"pre_step": True}, 2, 3),  # Eq. 11's plain step first: FedRep's body steps doubled
    ],
)
def test_plgu_grep_body_steps_and_passes_per_mini_batch(monkeypatch, args, steps, passes):
    from pfl.engine.trainer import ClientModule, StepOptimizer

    counts = {"steps": 0, "passes": 0}
    step, backward = StepOptimizer.step, ClientModule.manual_backward

    def counted_step(self):
        counts["steps"] += 1
        step(self)

    def counted_backward(self, loss, *a, **k):
        counts["passes"] += 1
        backward(self, loss, *a, **k)

    loop = make_loop(tiny_config("plgu_grep", {"head_epochs": 0, **args}, client={"batch_size": 8, "epochs": 2}))
    client = loop.client(0)
    batches = len(list(client.batches()))
    assert batches > 2
    monkeypatch.setattr(StepOptimizer, "step", counted_step)
    monkeypatch.setattr(ClientModule, "manual_backward", counted_backward)
    loop.method.local_update(client, loop.method.payload(loop.server, 0))
    assert counts == {"steps": steps * batches, "passes": passes * batches}


def test_plgu_grep_rho_zero_control_from_the_command_line():
    exp = CONF / "experiment" / "plgu_digits_pat3.yaml"
    argv = ["--config", str(exp), "--config", str(CONF / "method" / "plgu_grep.yaml"), "--method.rho", "0"]
    method = parse_fit_args(argv)[0].method
    assert (method.name, method.rho, method.pre_step) == ("plgu_grep", 0.0, False)
    assert parse_fit_args([*argv, "--method.pre_step", "true"])[0].method.pre_step is True


# -- PLGU-LF ------------------------------------------------------------------------------------------
def _lf_client(loop: FederatedLoop, cid: int = 0):
    """A client whose personalized model moved far on the classifier and a little on the first layer."""
    w = loop.server["global"]
    layers = list(loop.flat.layout.layer_slices().values())
    gen = torch.Generator().manual_seed(0)
    theta = w.clone()
    for sl, size in ((layers[0], 0.01), (layers[1], 1.0)):  # random: a constant shift of all logits is invisible
        theta[sl] += size * torch.randn(sl.stop - sl.start, generator=gen)
    client = loop.client(cid)
    client.state["personal"] = theta
    return client, w, theta, layers


def test_plgu_lf_round_start_keeps_the_most_personal_layers_and_perturbs_only_the_others():
    loop = make_loop(tiny_config("plgu_lf", {"personal_layers": 1}))
    client, w, theta, layers = _lf_client(loop)
    method: PLGULF = loop.method
    xi, personal, universal = method.split_layers(theta, w, client)
    assert personal == [1] and universal == [0] and float(xi[1]) > float(xi[0]) > 0
    start = method.personal_start(theta, w, personal, client.flat)
    assert torch.equal(start[layers[1]], theta[layers[1]]) and torch.equal(start[layers[0]], w[layers[0]])
    scale = method.perturbation_scale(xi, universal, client)
    assert torch.equal(scale[layers[1]], torch.zeros_like(scale[layers[1]]))
    assert torch.equal(scale[layers[0]], torch.full_like(scale[layers[0]], float(xi[0])))


@pytest.mark.parametrize("ascent", ["personal", "global"])
def test_plgu_lf_step_equals_algorithm_1_by_hand(ascent):
    loop = make_loop(tiny_config("plgu_lf", {"personal_layers": 1, "ascent": ascent}, client=ONE_BATCH))
    client, w, theta_prev, layers = _lf_client(loop)
    x, y = _only_batch(loop, client.cid)
    n = loop.flat.num_params
    upload = loop.method.local_update(client, {"global": w})
    theta0 = w.clone()
    theta0[layers[1]] = theta_prev[layers[1]]
    g_theta = _grad_at(loop, theta0[:n], x, y)
    g_ascent = g_theta if ascent == "personal" else _grad_at(loop, w[:n], x, y)
    xi0 = (theta_prev[layers[0]] - w[layers[0]]).norm() / (layers[0].stop - layers[0].start)
    xi1 = (theta_prev[layers[1]] - w[layers[1]]).norm() / (layers[1].stop - layers[1].start)
    lam = torch.zeros(n)
    lam[layers[0]] = xi0 / (xi0 + xi1)  # Λ on the universal layer; the personal layer is not perturbed
    eps = RHO * lam * g_ascent / g_ascent.norm()
    torch.testing.assert_close(client.state["personal"][:n], theta0[:n] - 0.1 * g_theta, rtol=0, atol=1e-6)
    expected = w[:n] - 0.1 * _grad_at(loop, w[:n] + eps, x, y)
    torch.testing.assert_close(upload.state[:n], expected, rtol=0, atol=1e-6)
    assert (expected - (w[:n] - 0.1 * _grad_at(loop, w[:n], x, y))).abs().max() > 1e-6  # ε mattered


# -- PLGU-GRep ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("pre_step", [False, True])
def test_plgu_grep_body_step_equals_eqs_11_to_13_by_hand(pre_step):
    cfg = tiny_config(
        "plgu_grep",
        {"head_epochs": 0, "pre_step": pre_step},
        client=ONE_BATCH,
        model={"name": "mlp", "hidden": [16, 16]},
    )
    loop = make_loop(cfg)
    layers = list(loop.flat.layout.layer_slices().values())  # two body layers and the head
    body, head = slice(0, layers[-1].start), layers[-1]
    n = loop.flat.num_params
    client = loop.client(0)
    payload = loop.method.payload(loop.server, 0)
    own = loop.init_state.clone()
    own[layers[0]] += 0.02  # the client's last representation: moved on the first layer only
    own[head] += 0.5
    client.state["personal"] = own
    start = own.clone()
    start[loop.method.mask(loop.flat.layout)] = payload["shared"]
    x, y = _only_batch(loop, 0)
    loop.method.local_update(client, payload)
    phi1 = start[:n].clone()
    if pre_step:  # Eq. 11's plain step first
        phi1 -= 0.1 * _grad_at(loop, start[:n], x, y, region=body)
    g = _grad_at(loop, phi1, x, y, region=body)
    lam = torch.zeros(n)
    lam[layers[0]] = 1.0  # ξ: only layer 0 moved, so it gets all the score; layer 1 gets 0
    eps = RHO * lam * g / g[body].norm()  # Eq. 12: the norm over the body's gradient
    expected = phi1 - 0.1 * _grad_at(loop, phi1 + eps, x, y, region=body)  # Eq. 13
    torch.testing.assert_close(client.state["personal"][:n], expected, rtol=0, atol=1e-6)
    assert torch.equal(client.state["personal"][head], own[head])  # the head stays frozen in the body phase
    assert (expected - (phi1 - 0.1 * g)).abs().max() > 1e-6  # ε mattered


# -- registry-style properties ------------------------------------------------------------------------
@pytest.mark.parametrize("name", METHODS)
def test_same_seed_same_numbers_and_resume_is_identical(name):
    cfg = tiny_config(name, trainer=HALF, client=MOMENTUM)
    a = make_loop(cfg)
    a.run_round(), a.run_round()
    b = make_loop(cfg)
    b.checkpointer.load_state_dict(copy.deepcopy(a.checkpointer.state_dict()))
    a.run_round(), b.run_round()
    assert _equal_servers(a, b) and _same_metrics(a, b)


@pytest.mark.parametrize("name", METHODS)
def test_a_round_does_not_depend_on_the_order_clients_train_in(name):
    cfg = tiny_config(name, trainer=HALF, client=MOMENTUM)
    a, b = make_loop(cfg), make_loop(cfg)
    for loop in (a, b):
        loop.run_round()  # every client has personal state from round 0 on
    a.run_round()
    sampled = b.sampled_clients().tolist()
    payloads = {cid: b.method.payload(b.server, cid) for cid in sampled}
    uploads = {cid: b.method.local_update(b.client(cid), payloads[cid]) for cid in reversed(sampled)}
    ordered = dict(sorted(uploads.items()))
    b.aggregate(ordered, ordered)  # no upload transform: the server receives and combines the same uploads
    b.progress.round += 1  # (the loop's communication counters did not see this round: compare the models)
    assert _equal_servers(a, b) and _same_metrics(a, b, ("pm.", "gm."))


@pytest.mark.parametrize(
    ("name", "args", "field"),
    [
        ("fedsam", {"rho": -0.1}, "method.rho"),
        ("plgu_lf", {"personal_layers": -1}, "method.personal_layers"),
        ("plgu_lf", {"scale": "diag"}, "method.scale"),
        ("plgu_lf", {"ascent": "both"}, "method.ascent"),
        ("plgu_grep", {"p": 0.5}, "method.p"),
        ("plgu_ghn", {"rho": -1.0}, "method.rho"),
        ("plgu_ghn", {"sam_gradient": "exact"}, "method.sam_gradient"),
        ("pfedhn", {"hn_momentum": 1.0}, "method.hn_momentum"),
        ("pfedhn", {"chunk": 0}, "method.chunk"),
    ],
)
def test_bad_hyper_parameters_are_config_errors(name, args, field):
    with pytest.raises(ConfigError, match=field):
        method_class(name)(**args)


def test_plgu_grep_needs_a_body_to_perturb():
    with pytest.raises(ConfigError, match="method.personal_layers"):
        make_loop(tiny_config("plgu_grep", {"personal_layers": 2}))  # the tiny MLP has two layers


@pytest.mark.parametrize("path", sorted((CONF / "experiment").glob("plgu_*.yaml")), ids=lambda p: p.stem)
def test_every_plgu_experiment_parses_with_every_plgu_method_config(path):
    for name in PLGU_METHODS:
        cfg = parse_fit_args(["--config", str(path), "--config", str(CONF / "method" / f"{name}.yaml")])[0]
        assert cfg.client.batch_size == 50 and cfg.client.epochs == 5 and cfg.data.partition == "pathological"


# -- PLGU's buffers, regression, bounds and branches -----------------------------------------------------
def test_buffer_slices_and_views_follow_the_flat_layout():
    loop = make_loop(tiny_config("plgu_lf", model=ModelConfig(name="tests.methods.helpers:bn_mlp")))
    flat = loop.worker.flat
    assert buffer_slices(flat) == {"2": slice(0, 32)}  # the BatchNorm's running mean and variance
    state = loop.init_state.clone()
    views = buffer_views(flat, state)
    p = flat.num_params
    assert list(views) == ["2.running_mean", "2.running_var"]
    assert views["2.running_mean"].data_ptr() == state[p:].data_ptr()  # views into the state, not copies
    assert torch.equal(views["2.running_var"], state[p + 16 : p + 32])


def test_plgu_lf_regression_compares_the_squeezed_output_with_the_target():
    data = DataConfig(source="synthetic_regression", num_clients=4, test_frac=0.3)
    loop = make_loop(tiny_config("plgu_lf", {"personal_layers": 1}, data=data, model={"name": "mlp", "hidden": [8]}))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an unsqueezed (B, 1) output against (B,) targets would broadcast (and warn)
        loop.run_round()


def test_plgu_bounds_accept_their_edges():
    PLGULF(rho=0.0, p=1.0)
    method_class("plgu_grep")(rho=0.0, p=1.0)
    for cls in (PLGULF, method_class("plgu_grep")):
        with pytest.raises(ConfigError, match="method.rho"):
            cls(rho=-0.01)
        with pytest.raises(ConfigError, match="method.p"):
            cls(p=0.5)


def test_identity_scale_is_none_over_every_layer_and_zero_on_personal_layers():
    loop = make_loop(tiny_config("plgu_lf", {"scale": "identity"}))
    ctx = loop.client(0)
    layers = list(ctx.layout.layer_slices().values())
    xi = torch.rand(len(layers))
    assert loop.method.perturbation_scale(xi, list(range(len(layers))), ctx) is None  # Λ = I
    scale = loop.method.perturbation_scale(xi, [0], ctx)
    assert torch.equal(scale[layers[0]], torch.ones(layers[0].stop - layers[0].start))
    assert not bool(scale[layers[0].stop :].any())  # zero on the personal layers


@pytest.mark.parametrize("head_epochs", [0, 1])
def test_plgu_grep_trains_the_head_first_only_when_asked(head_epochs):
    loop = make_loop(tiny_config("plgu_grep", {"head_epochs": head_epochs}))
    ctx = loop.client(0)
    loop.method.train(ctx, loop.server["global"].clone())
    assert len(ctx.fits) == 1 + int(head_epochs > 0)
    if head_epochs:
        assert ctx.fits[0].samples_seen == ctx.num_samples  # one head epoch


def test_personal_step_under_a_gradient_scaler_skips_an_overflowing_step():
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**127)  # loss · s overflows float32
    fabric = L.Fabric(accelerator="cpu", plugins=[MixedPrecision("16-mixed", "cpu", scaler)])
    loop = make_loop(tiny_config("plgu_lf", {"personal_layers": 1}, client=ONE_BATCH), fabric=fabric)
    ctx = loop.client(0)
    w = loop.server["global"].clone()
    loop.method.local_update(ctx, {"global": w})
    assert len(list(ctx.batches())) == 1
    assert torch.equal(ctx.state["personal"], w)  # the one personal step was skipped, not taken unscaled


def test_personal_step_under_a_gradient_scaler_is_the_unscaled_step():
    def personal_move(fabric):
        loop = make_loop(tiny_config("plgu_lf", {"personal_layers": 1}, client=ONE_BATCH), fabric=fabric)
        ctx, w = loop.client(0), loop.server["global"].clone()
        loop.method.local_update(ctx, {"global": w})
        return ctx.state["personal"] - w

    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    scaled = personal_move(L.Fabric(accelerator="cpu", plugins=[MixedPrecision("16-mixed", "cpu", scaler)]))
    plain = personal_move(L.Fabric(accelerator="cpu"))
    assert plain.norm() > 0 and float((scaled - plain).norm() / plain.norm()) < 0.05  # fp16 autocast noise only


def two_bn_mlp(cfg, input_shape, num_classes):
    """Two BatchNorm layers: 2 × 32 float buffers, in module order."""
    width = int(torch.tensor(input_shape).prod())
    return torch.nn.Sequential(
        torch.nn.Flatten(),
        torch.nn.Linear(width, 16),
        torch.nn.BatchNorm1d(16),
        torch.nn.Linear(16, 16),
        torch.nn.BatchNorm1d(16),
        torch.nn.Linear(16, num_classes),
    )


def test_personal_start_takes_a_personal_layers_buffers_from_theta():
    loop = make_loop(tiny_config("plgu_lf", model=ModelConfig(name="tests.methods.test_plgu:two_bn_mlp")))
    flat = loop.worker.flat
    assert buffer_slices(flat) == {"2": slice(0, 32), "4": slice(32, 64)}
    w = loop.init_state.clone()
    theta = w + torch.arange(w.numel(), dtype=w.dtype)  # every entry differs from w
    names = list(flat.layout.layer_slices())
    bn = names.index("4")  # the second BatchNorm layer as the personal one
    start = loop.method.personal_start(theta, w, [bn], flat)
    p = flat.num_params
    layer = flat.layout.layers[bn][1]
    assert torch.equal(start[layer], theta[layer]) and torch.equal(start[p + 32 : p + 64], theta[p + 32 : p + 64])
    others = torch.ones_like(w, dtype=torch.bool)
    others[layer] = False
    others[p + 32 : p + 64] = False
    assert torch.equal(start[others], w[others])  # the rest, the other BatchNorm's buffers included, from w


def flat_regressor(cfg, input_shape, num_classes):
    """A linear regressor whose output is already (B,), which the engine's squeeze(-1) leaves as is."""
    width = int(torch.tensor(input_shape).prod())
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(width, 1), torch.nn.Flatten(0))


def test_plgu_lf_personal_step_trains_a_regressor_with_b_outputs_like_the_global_copy():
    """Every layer personal: θ_i and w_i both take plain SGD steps from w on the same batches, so the
    personalized model equals the uploaded copy, also for a model whose output has no trailing 1."""
    data = DataConfig(source="synthetic_regression", num_clients=4, test_frac=0.3)
    model = ModelConfig(name="tests.methods.test_plgu:flat_regressor")
    loop = make_loop(tiny_config("plgu_lf", {"personal_layers": 5}, data=data, model=model, client=MOMENTUM))
    ctx, w = loop.client(0), loop.server["global"].clone()
    upload = loop.method.local_update(ctx, {"global": w})
    assert not torch.equal(upload.state, w)
    torch.testing.assert_close(ctx.state["personal"], upload.state, rtol=0, atol=1e-6)


def test_plgu_lf_fits_describe_their_stacked_form():
    """What ``pfl.engine.stacked`` reads from a PLGU-LF fit: the personal ascent's settings and θ_i
    (the state the fit trains in place), ε ≡ 0 as ρ = 0, and why the global ascent runs alone."""
    from pfl.engine.stacked import sam_row, spec_problem

    for layers, perturbs in ((0, True), (99, False)):
        loop = make_loop(tiny_config("plgu_lf", {"personal_layers": layers}, client={"momentum": 0.5, "lr": 0.03}))
        specs = []
        fit = loop.worker.train
        loop.worker.train = lambda cid, start, round_idx, spec, fit=fit, seen=specs: (
            seen.append(spec) or fit(cid, start, round_idx, spec)
        )
        loop.run_round()
        assert specs and loop.method.vectorize_problems() == []
        for spec in specs:
            row, ctx = sam_row(spec), spec.context
            assert spec_problem(spec) is None and row is not None and row.personal is not None
            assert row.personal.state is ctx["theta"]  # written back in place, where local_update reads it
            assert (row.personal.lr, row.personal.momentum) == (0.03, 0.5)
            assert row.personal.weight_decay == loop.worker.settings.weight_decay
            assert row.rho == (loop.method.rho if perturbs else 0.0) and (row.scale is not None) == perturbs
            ctx["ascent"] = "global"
            assert sam_row(spec) is None and spec_problem(spec) == "a custom objective (PLGULFObjective)"
    (line,) = PLGULF(ascent="global").vectorize_problems()
    assert line.startswith("plgu_lf's ascent='global' LWSAM steps") and "one at a time" in line
