"""Stacked fits (pfl.engine.stacked): several clients' fits trained as one vmapped step per batch position
equal the worker's fits option by option (per-client lr, epochs, momentum, indices, terms, SAM, PLGU-LF's
personal model, BatchNorm's running statistics, keyed dropout, bf16), and the full pass equals the
worker's mean gradient. Whole rounds of every method: ``test_lockstep_real_runs.py``."""

from __future__ import annotations

import math

import pytest
import torch

from pfl.engine.stacked import FitRequest, StackedTrainer, spec_problem
from pfl.engine.terms import Freeze, LinearTerm, Proximal, ProximalStep, Term, stack_terms, stackable
from pfl.engine.trainer import ClientTrainer, FitSpec
from pfl.methods.fedora import DecoupledPull
from pfl.methods.pgfed import AuxiliaryRisk
from tests.conftest import make_loop, tiny_config

# Validation splits, augmentation and a cap on client sizes, as the registry-wide lockstep comparison.
DATA = {"val_frac": 0.2, "augment": "flip", "max_client_samples": 90}


def _worker():
    cfg = tiny_config("fedavg", client={"momentum": 0.9, "weight_decay": 1e-3, "drop_last": True}, data=DATA)
    return make_loop(cfg)


def _sequential(worker: ClientTrainer, cid: int, start, spec: FitSpec):
    stats = worker.train(cid, start, 0, spec)
    return worker.snapshot(), worker.momentum_buffer(), stats


def _bn_net(inputs: int, widths: tuple[int, ...] = (16,)) -> torch.nn.Module:
    """A small MLP with a BatchNorm layer after each hidden layer of ``widths``, drawn from seed 0."""
    torch.manual_seed(0)
    layers: list[torch.nn.Module] = [torch.nn.Flatten()]
    for fan_in, width in zip((inputs, *widths), widths, strict=False):
        layers += [torch.nn.Linear(fan_in, width), torch.nn.BatchNorm1d(width), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers, torch.nn.Linear(widths[-1], 10))


def _stacked_as_sequential(w, cids, start, specs):
    """Fit the clients stacked (the second spec's client alone, as a group of its own) from a model left in
    eval mode, as an evaluation leaves it (the stacked fit trains in train mode, as ClientTrainer.train), and
    check each result against its sequential fit; the requests and the stacked trainer."""
    expected = [_sequential(w, cid, start, spec)[0] for cid, spec in zip(cids, specs, strict=True)]
    requests = [FitRequest.of(w, cid, start, 0, spec) for cid, spec in zip(cids, specs, strict=True)]
    trainer = StackedTrainer(w)
    w.module.eval()
    trainer.train(requests[:1] + requests[2:])
    trainer.train(requests[1:2])
    for r, state in zip(requests, expected, strict=True):
        torch.testing.assert_close(r.out, state, rtol=0, atol=1e-5)
    return requests, trainer


def test_a_stacked_fit_equals_the_workers_fit_option_by_option():
    loop = _worker()
    w, start = loop.worker, loop.init_state
    p = w.flat.num_params
    g = torch.Generator().manual_seed(0)
    buf = torch.randn(p, generator=g) * 0.1
    rest = w.split(3).train[::2]
    specs = {  # one group: per-client lr, epochs, momentum, restored buffer, indices, purpose
        0: FitSpec(epochs=2, lr=0.05),
        1: FitSpec(epochs=1, momentum=0.0),
        2: FitSpec(epochs=3, momentum=0.5, momentum_buffer=buf, purpose="personal"),
        3: FitSpec(indices=rest, momentum_buffer=buf, momentum=0.0),
        4: FitSpec(epochs=0),
    }
    expected = {cid: _sequential(w, cid, start, spec) for cid, spec in specs.items()}
    requests = [FitRequest.of(w, cid, start, 0, spec) for cid, spec in specs.items()]
    trainer, rows = StackedTrainer(w), []
    step = trainer.step
    trainer.step = lambda p, *rest: rows.append(len(p)) or step(p, *rest)
    trainer.train(requests)
    # each step trains the clients with a batch at it, not the whole stack
    assert sum(rows) == sum(r.stats.steps for r in requests) and min(rows) < max(rows) < len(requests)
    for r in requests:
        state, momentum, stats = expected[r.cid]
        torch.testing.assert_close(r.out, state, rtol=0, atol=1e-5)
        if momentum is None:
            assert r.buffer_out is None, r.cid
        else:
            torch.testing.assert_close(r.buffer_out, momentum, rtol=0, atol=1e-5)
        assert (r.stats.steps, r.stats.num_samples, r.stats.samples_seen) == (
            stats.steps,
            stats.num_samples,
            stats.samples_seen,
        )
        assert r.stats.loss == pytest.approx(stats.loss, abs=1e-5, nan_ok=True)
    assert requests[4].stats.steps == 0 and len({r.stats.steps for r in requests}) >= 4  # ragged stack


def test_stacked_fits_with_terms_equal_the_workers_fits():
    loop = _worker()
    w, start = loop.worker, loop.init_state
    p = w.flat.num_params
    g = torch.Generator().manual_seed(1)
    anchors = [start[:p] + 0.1 * torch.randn(p, generator=g) for _ in range(3)]
    head = w.flat.layout.tail(1)

    def terms(k: int) -> list[Term]:  # several terms per fit, coefficients differ per client
        return [
            LinearTerm(0.01 * anchors[k]),
            Proximal(anchors[k], 0.1 * (k + 1)),
            ProximalStep(anchors[(k + 1) % 3], 0.5 * k),
            Freeze(start[:p], head),
        ]

    expected = [_sequential(w, k, start, FitSpec(terms=terms(k), lr=0.05 * (k + 1)))[0] for k in range(3)]
    requests = [FitRequest.of(w, k, start, 0, FitSpec(terms=terms(k), lr=0.05 * (k + 1))) for k in range(3)]
    StackedTrainer(w).train(requests)
    for k, r in enumerate(requests):
        torch.testing.assert_close(r.out, expected[k], rtol=0, atol=1e-5)
        assert torch.equal(r.out[:p][head], start[:p][head])  # frozen exactly


def _stackable_terms(p: int, g: torch.Generator) -> dict[type, list[Term]]:
    """Three terms of every class that has a stacked form, with per-client tensors and coefficients."""

    def v() -> torch.Tensor:
        return torch.randn(p, generator=g)

    def alpha() -> torch.Tensor:
        return torch.rand(4, generator=g)

    return {
        Proximal: [Proximal(v(), mu) for mu in (0.1, 0.2, 0.3)],
        ProximalStep: [ProximalStep(v(), lam) for lam in (0.0, 0.5, 2.0)],
        LinearTerm: [LinearTerm(v()) for _ in range(3)],
        Freeze: [Freeze(v(), slice(2, 7)) for _ in range(3)],
        DecoupledPull: [DecoupledPull(v(), lam) for lam in (0.1, 1.0, 3.0)],
        AuxiliaryRisk: [AuxiliaryRisk(v(), alpha(), alpha(), 0.1 * k, gbar=v(), clip=True) for k in range(3)],
    }


def _subclasses(cls: type) -> set[type]:
    return {c for s in cls.__subclasses__() for c in {s} | _subclasses(s)}


def test_stacked_terms_equal_their_sequential_hooks_row_by_row():
    p, g = 12, torch.Generator().manual_seed(2)
    cases = _stackable_terms(p, g)
    # Every class with a stacked form is checked here (a new one must be added above).
    assert {c for c in _subclasses(Term) if "stack" in c.__dict__} == set(cases)
    lrs = [0.1, 0.05, 0.2]
    for cls, terms in cases.items():
        params, grads = torch.randn(3, p, generator=g), torch.randn(3, p, generator=g)
        rows_p, rows_g, seq_p, seq_g = params.clone(), grads.clone(), params.clone(), grads.clone()
        before = [t.alpha.clone() if hasattr(t, "alpha") else None for t in terms]  # AuxiliaryRisk's state
        stacked = stack_terms([[t] for t in terms])[0]
        stacked.on_grad(rows_p, rows_g)
        stacked.on_step(rows_p, torch.tensor([[lr] for lr in lrs], dtype=torch.float64))
        if hasattr(stacked, "finish"):
            stacked.finish()  # written back into each client's own tensor
        for k, term in enumerate(terms):
            if before[k] is not None:
                after, term.alpha = term.alpha, before[k]
            term.on_grad(seq_p[k], seq_g[k])
            term.on_step(seq_p[k], lrs[k])
            if before[k] is not None:
                torch.testing.assert_close(after, term.alpha, rtol=0, atol=1e-6, msg=cls.__name__)
        torch.testing.assert_close(rows_g, seq_g, rtol=0, atol=1e-6, msg=cls.__name__)
        torch.testing.assert_close(rows_p, seq_p, rtol=0, atol=1e-6, msg=cls.__name__)


def test_a_term_subclass_without_its_own_stacked_form_runs_one_client_at_a_time():
    class Scaled(Proximal):
        def on_grad(self, params, grads):
            grads.add_(params - self.anchor, alpha=2 * self.mu)

    anchor = torch.zeros(3)
    assert stackable(Proximal(anchor, 1.0)) and not stackable(Scaled(anchor, 1.0))
    assert "Scaled" in spec_problem(FitSpec(terms=[Scaled(anchor, 1.0)]))
    assert "loss_fn" in spec_problem(FitSpec(loss_fn=lambda net, x, y: net(x).sum()))
    assert spec_problem(FitSpec(terms=[Proximal(anchor, 1.0)])) is None


def test_stacked_sam_fits_equal_the_workers_sam_fits():
    from pfl.engine.sam import SAMObjective, sam_context

    loop = _worker()
    w, start = loop.worker, loop.init_state
    body = slice(0, w.flat.layout.tail(1).start)
    contexts = [sam_context(0.05), sam_context(0.1, p=3.0, region=body), sam_context(0.0, region=body)]
    specs = [FitSpec(objective=SAMObjective, context=c, lr=0.05 * (k + 1)) for k, c in enumerate(contexts)]
    expected = [_sequential(w, k, start, spec)[0] for k, spec in enumerate(specs)]
    requests = [FitRequest.of(w, k, start, 0, spec) for k, spec in enumerate(specs)]
    assert all(spec_problem(spec) is None for spec in specs)
    StackedTrainer(w).train(requests)
    for k, r in enumerate(requests):
        torch.testing.assert_close(r.out, expected[k], rtol=0, atol=1e-5)
    assert not torch.allclose(expected[0], expected[2], atol=1e-3)  # SAM's pass changes the result


def test_padding_every_step_to_the_batch_size_changes_no_result():
    loop = make_loop(tiny_config("fedavg", client={"momentum": 0.9}))
    w, start = loop.worker, loop.init_state
    specs = [FitSpec(epochs=2, lr=0.05), FitSpec(momentum=0.0)]
    results, widths = [], []
    for static in (False, True):
        trainer = StackedTrainer(w)
        trainer.static_width = static  # what compile=True and cuda_graphs set: one input width for every step
        trainer.stack_rows = "powers" if static else "active"  # as cuda_graphs sets
        step = trainer.step
        trainer.step = lambda p, x, y, m, step=step, s=static: (
            widths.append((s, x.shape[1], len(p))) or step(p, x, y, m)
        )
        requests = [FitRequest.of(w, k, start, 0, spec) for k, spec in enumerate(specs)]
        trainer.train(requests)
        results.append(torch.stack([r.out for r in requests]))
        # only the clients with a batch train (static: a power of two of them, here each step's count)
        assert sum(n for st, _, n in widths if st == static) == sum(r.stats.steps for r in requests)
    torch.testing.assert_close(results[1], results[0], rtol=0, atol=1e-6)
    bs = w.settings.batch_size
    assert {width for static, width, _ in widths if static} == {bs}
    assert {width for static, width, _ in widths if not static} > {bs}  # short last batches, unpadded


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_a_stack_filled_up_with_clients_without_a_batch_moves_only_the_clients_with_one(momentum):
    # Captured steps stack a power of two of rows: 3 clients with a batch of 5 train as 4 rows, one of them a
    # client without a batch, whose parameters and momentum must not move (unlike the 3 others' rows).
    loop = make_loop(tiny_config("fedavg", client={"momentum": momentum, "weight_decay": 0.01}))
    w, start = loop.worker, loop.init_state
    specs = [FitSpec(epochs=e, lr=lr) for e, lr in ((3, 0.05), (1, 0.05), (2, 0.02), (1, 0.05), (2, 0.1))]
    results, stacked = [], {}
    for rows in ("active", "powers"):
        trainer = StackedTrainer(w)
        trainer.static_width, trainer.stack_rows = rows == "powers", rows  # "powers": as cuda_graphs sets
        step = trainer.step
        counts = stacked[rows] = []
        trainer.step = lambda p, *rest, step=step, counts=counts: counts.append(len(p)) or step(p, *rest)
        requests = [FitRequest.of(w, k, start, 0, spec) for k, spec in enumerate(specs)]
        trainer.train(requests)
        results.append(torch.stack([r.out for r in requests]))
    assert len(stacked["active"]) == len(stacked["powers"])  # one pass per step either way
    filled = [n for n, m in zip(stacked["powers"], stacked["active"], strict=True) if n > m]
    assert filled and 3 in [m for n, m in zip(stacked["powers"], stacked["active"], strict=True) if n > m]
    torch.testing.assert_close(results[1], results[0], rtol=0, atol=1e-6)
    sequential = torch.stack([_sequential(w, k, start, spec)[0] for k, spec in enumerate(specs)])
    torch.testing.assert_close(results[1], sequential, rtol=0, atol=1e-5)


@pytest.mark.parametrize("rows", ["active", "powers"])
def test_a_plain_step_of_some_clients_updates_their_rows_and_a_step_of_all_or_with_a_term_every_row(rows, monkeypatch):
    import pfl.engine.stacked as stacked

    calls: list[tuple] = []
    step, step_rows = stacked._StackSGD.step, stacked._StackSGD.step_rows

    def spy_step(self, params, grads, buf, active, every, terms):
        calls.append(("all", every, bool(active.all()), len(params)))
        return step(self, params, grads, buf, active, every, terms)

    def spy_rows(self, params, rows, grads, buf, sel, active, every):
        assert torch.equal(rows, params[sel])
        calls.append(("rows", every, bool(active[sel].all()), len(sel)))
        return step_rows(self, params, rows, grads, buf, sel, active, every)

    monkeypatch.setattr(stacked._StackSGD, "step", spy_step)
    monkeypatch.setattr(stacked._StackSGD, "step_rows", spy_rows)
    loop = make_loop(tiny_config("fedavg", client={"momentum": 0.5}))
    w, start = loop.worker, loop.init_state
    specs = [FitSpec(epochs=e) for e in (3, 1, 2, 1, 2)]
    trainer = StackedTrainer(w)
    trainer.static_width, trainer.stack_rows = rows == "powers", rows
    trainer.train([FitRequest.of(w, k, start, 0, spec) for k, spec in enumerate(specs)])
    # every client with a batch: every row, no selection; some: their rows only, a selection only for a
    # row without a batch (a power of two filled up)
    assert {c[0] for c in calls} == {"all", "rows"}
    assert all(c[1] == c[2] and c[3] == 5 for c in calls if c[0] == "all")
    assert all(c[1] == c[2] and c[3] < 5 for c in calls if c[0] == "rows")
    assert any(not c[1] for c in calls if c[0] == "rows") == (rows == "powers")
    calls.clear()
    anchor = start[: w.flat.num_params].clone()
    proximal = [FitSpec(epochs=e, terms=[Proximal(anchor, 0.1)]) for e in (3, 1, 2, 1, 2)]
    trainer.train([FitRequest.of(w, k, start, 0, spec) for k, spec in enumerate(proximal)])
    assert {c[0] for c in calls} == {"all"} and {c[1] for c in calls} == {True, False}  # a term: every row
    assert all(c[1] == c[2] for c in calls)


def test_batchnorm_running_statistics_stack_per_client():
    from pfl.engine.sam import SAMObjective, sam_context
    from pfl.engine.stacked import model_problems
    from pfl.engine.trainer import TrainSettings

    data = make_loop(tiny_config("fedavg")).worker.data
    dim = data.x[0].numel()
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Flatten(), torch.nn.Linear(dim, 16), torch.nn.BatchNorm1d(16), torch.nn.ReLU(), torch.nn.Linear(16, 10)
    )
    w = ClientTrainer(net, data, TrainSettings(batch_size=16, lr=0.1, momentum=0.5), seed=0)
    assert model_problems(w) == [] and w.flat.num_buffers == 32
    sizes = {cid: len(w.split(cid).train) % 16 for cid in range(6)}
    cids = [c for c, rest in sizes.items() if rest != 1][:4]  # a batch of one has no batch statistics
    assert len({sizes[c] for c in cids}) > 1  # short last batches of different widths: no padding
    start = w.flat.snapshot()
    start[w.flat.num_params :] = torch.rand(w.flat.num_buffers)  # running statistics that differ from the init
    specs = [FitSpec(epochs=2), FitSpec(objective=SAMObjective, context=sam_context(0.05)), FitSpec(), FitSpec()]
    requests, trainer = _stacked_as_sequential(w, cids, start, specs)
    for r in requests:
        assert not torch.equal(r.out[w.flat.num_params :], start[w.flat.num_params :])  # statistics moved
    cumulative = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.BatchNorm1d(dim, momentum=None))
    assert "BatchNorm1d" in model_problems(ClientTrainer(cumulative, data, TrainSettings(), seed=0))[0]


def _lwsam_spec(w: ClientTrainer, start, rho: float, lr: float, momentum: float, scale=None) -> FitSpec:
    """PLGU-LF's fit (``PLGULF.local_update``) from ``start``, with a personal model θ of its own."""
    from pfl.engine.sam import sam_context
    from pfl.methods.plgu import PLGULFObjective

    p = w.flat.num_params
    theta = start.clone()
    theta[:p] += 0.05 * torch.randn(p, generator=torch.Generator().manual_seed(int(rho * 1000 + lr * 100)))
    leaf = theta[:p].detach().requires_grad_(True)  # shares theta's storage, as client.params(theta)
    optimizer = torch.optim.SGD([leaf], lr=lr, momentum=momentum, weight_decay=w.settings.weight_decay)
    context = sam_context(
        rho, 2.0, scale, theta=theta, theta_params=leaf, theta_optimizer=optimizer, ascent="personal", perturb=rho > 0
    )
    return FitSpec(objective=PLGULFObjective, context=context, lr=lr, momentum=momentum)


def _assert_lwsam_stacks(w: ClientTrainer, cids: list[int], start, settings: list[tuple]) -> None:
    specs = [_lwsam_spec(w, start, *s) for s in settings]
    expected = []
    for cid, spec in zip(cids, specs, strict=True):
        theta = spec.context["theta"].clone()
        state, _, stats = _sequential(w, cid, start, spec)
        expected.append((state, spec.context["theta"].clone(), stats.loss))
        spec.context["theta"].copy_(theta)  # the stacked fit starts from the same θ
    assert all(spec_problem(spec) is None for spec in specs)
    requests = [FitRequest.of(w, cid, start, 0, spec) for cid, spec in zip(cids, specs, strict=True)]
    StackedTrainer(w).train(requests)
    for r, spec, (state, theta, loss) in zip(requests, specs, expected, strict=True):
        torch.testing.assert_close(r.out, state, rtol=0, atol=1e-5)
        torch.testing.assert_close(spec.context["theta"], theta, rtol=0, atol=1e-5)  # θ written back in place
        assert r.stats.loss == pytest.approx(loss, abs=1e-5)  # θ's batch loss, as the sequential fit reports
    assert not torch.allclose(expected[0][0], expected[0][1], atol=1e-3)  # w and θ train apart


def test_stacked_lwsam_fits_equal_the_workers_plgu_lf_fits():
    loop = _worker()
    w, start = loop.worker, loop.init_state
    p = w.flat.num_params
    scale = torch.rand(p, generator=torch.Generator().manual_seed(1))
    scale[w.flat.layout.tail(1)] = 0  # a personal layer: no ε there
    # per-client ρ, lr, θ momentum and Λ; ρ = 0 (ε ≡ 0) in the same stack
    settings = [(0.05, 0.05, 0.9, scale), (0.2, 0.1, 0.0, None), (0.0, 0.02, 0.5, None)]
    _assert_lwsam_stacks(w, [0, 1, 2], start, settings)
    # ε changes the result: the same fit without it is another one
    with_eps = _sequential(w, 1, start, _lwsam_spec(w, start, 0.2, 0.1, 0.0))[0]
    without = _sequential(w, 1, start, _lwsam_spec(w, start, 0.0, 0.1, 0.0))[0]
    assert not torch.allclose(with_eps, without, atol=1e-4)
    global_ascent = _lwsam_spec(w, start, 0.05, 0.05, 0.0)
    global_ascent.context["ascent"] = "global"
    assert spec_problem(global_ascent) == "a custom objective (PLGULFObjective)"


def test_stacked_lwsam_fits_keep_each_models_running_statistics():
    from pfl.engine.trainer import TrainSettings

    data = make_loop(tiny_config("fedavg")).worker.data
    net = _bn_net(data.x[0].numel())
    w = ClientTrainer(net, data, TrainSettings(batch_size=16, lr=0.1, momentum=0.5, weight_decay=1e-3), seed=0)
    cids = [c for c in range(data.num_clients) if len(w.split(c).train) % 16 != 1][:2]  # no batch of one
    start = w.flat.snapshot()
    _assert_lwsam_stacks(w, cids, start, [(0.05, 0.1, 0.5), (0.1, 0.05, 0.0)])


# bf16 keeps 8 significant bits (relative step 2^-8 ≈ 4e-3): a stacked (vmapped) matmul and the
# sequential one may round a product to neighbouring bf16 values, so the paths agree to bf16's
# rounding, not to float32's 1e-5, and those roundings compound over a fit's steps. Measured on this
# test's fits (6 to 24 steps, parameters moving by 0.04 to 1.0): the largest difference is ≤ 1.1 % of
# how far the fit moved under bf16-mixed (float32 parameters, bf16 forward) and ≤ 2.4 % under
# bf16-true (bf16 parameters: a rounding step is 2^-7 at magnitude 1), the losses within 0.3 %. The
# bounds: 5 % of the movement, 2 % of the loss.
BF16_OF_MOVEMENT = 0.05
BF16_LOSS_REL = 0.02


def _bf16_linear_calls(monkeypatch) -> list[torch.dtype]:
    """The output dtypes of every ``F.linear`` call from now on (bf16: autocast or a bf16 model ran)."""
    seen: list[torch.dtype] = []
    linear = torch.nn.functional.linear

    def recording(*args, **kwargs):
        out = linear(*args, **kwargs)
        seen.append(out.dtype)
        return out

    monkeypatch.setattr(torch.nn.functional, "linear", recording)
    return seen


@pytest.mark.parametrize("precision", ["bf16-mixed", "bf16-true"])
def test_bf16_stacked_fits_equal_the_workers_fits(precision, monkeypatch):
    import lightning as L

    cfg = tiny_config("fedavg", trainer={"precision": precision}, client={"momentum": 0.9, "weight_decay": 1e-3})
    w = make_loop(cfg, fabric=L.Fabric(accelerator="cpu", precision=precision)).worker
    start = w.flat.snapshot()
    assert start.dtype == (torch.bfloat16 if precision == "bf16-true" else torch.float32)  # *-true: stored in bf16
    specs = [FitSpec(epochs=2, lr=0.05), FitSpec(), FitSpec(lr=0.02, momentum=0.0)]
    expected = [_sequential(w, k, start, spec) for k, spec in enumerate(specs)]
    requests = [FitRequest.of(w, k, start, 0, spec) for k, spec in enumerate(specs)]
    dtypes = _bf16_linear_calls(monkeypatch)
    StackedTrainer(w).train(requests)
    assert dtypes and set(dtypes) == {torch.bfloat16}  # the stacked forward ran in bf16
    for r, (state, _, stats) in zip(requests, expected, strict=True):
        assert r.out.dtype == start.dtype and r.stats.steps == stats.steps
        moved = (state.float() - start.float()).abs().max()
        assert (r.out.float() - state.float()).abs().max() <= BF16_OF_MOVEMENT * moved, r.cid
        assert r.stats.loss == pytest.approx(stats.loss, rel=BF16_LOSS_REL)


def test_a_gradient_scaler_stays_refused_in_one_line():
    from pfl.engine.stacked import model_problems

    w = _worker().worker
    assert model_problems(w, "bf16-mixed") == model_problems(w, "bf16-true") == []
    for precision in ("16-mixed", "16"):
        (line,) = model_problems(w, precision)
        assert line == f"precision {precision} uses a gradient scaler; use bf16-mixed or a *-true precision"


def test_stacked_fits_with_per_client_lr_epochs_and_momentum_keep_to_the_training_device():
    """PAGE's and Dap-FL's clients train with their own lr and epochs in one stacked fit: every tensor
    the step builds (learning-rate column, momentum, the active-client mask, batches, losses) meets
    the device's parameters on the device (tests/helpers/device_tags.py stands in for CUDA)."""
    from tests.helpers.device_tags import is_on_device, training_device

    loop = make_loop(tiny_config("fedavg", client={"momentum": 0.9}))
    w = loop.worker
    with training_device() as dev:
        w.device, w.data = dev, w.data.to(dev)
        start = loop.init_state.to(dev)
        specs = [FitSpec(epochs=2, lr=0.05), FitSpec(epochs=1, lr=0.1), FitSpec(epochs=3, lr=0.02)]
        requests = [FitRequest.of(w, cid, start, 0, spec) for cid, spec in enumerate(specs)]
        trainer = StackedTrainer(w)
        vmapped = trainer.step  # functorch hands back untagged tensors; on CUDA they are the device's
        trainer.step = lambda *args: tuple(out.to(dev) for out in vmapped(*args))
        trainer.train(requests)
        assert all(is_on_device(r.out) and is_on_device(r.buffer_out) for r in requests)
        assert len({r.stats.steps for r in requests}) == 3 and all(r.stats.loss > 0 for r in requests)


@pytest.mark.parametrize("rows", ["powers", "all"])
def test_mean_gradients_of_stacks_holding_clients_without_a_batch_equal_the_workers(rows):
    """As captured ("powers": a power of two of rows) and compiled ("all") steps stack them: the rows of
    clients without a batch at a position gain nothing."""
    from pfl.engine.stacked import GradientRequest

    w = _worker().worker
    cids = [0, 1, 2, 3]  # 3, 4, 4 and 4 batches: 3 clients at the last position, stacked as 4 rows
    start = w.flat.snapshot()
    states = [start + 0.01 * k for k in range(len(cids))]
    expected = [w.mean_gradient(cid, state, 1) for cid, state in zip(cids, states, strict=True)]
    requests = [GradientRequest(cid, state, 1) for cid, state in zip(cids, states, strict=True)]
    trainer, stacked = StackedTrainer(w), []
    trainer.static_width, trainer.stack_rows = True, rows
    step = trainer.gradient_step
    trainer.gradient_step = lambda p, *rest: stacked.append(len(p)) or step(p, *rest)
    trainer.mean_gradients(requests)
    batches = sum(math.ceil(len(w.split(c).train) / w.settings.batch_size) for c in cids)
    assert batches == 15 and sum(stacked) == 16  # a row without a batch was stacked
    for r, (grad, loss) in zip(requests, expected, strict=True):
        torch.testing.assert_close(r.grad, grad, rtol=0, atol=1e-6)
        assert r.loss == pytest.approx(loss, abs=1e-6)


def test_stacked_mean_gradients_equal_the_workers_mean_gradients():
    """PGFed's full pass (``ClientTrainer.mean_gradient``), several clients of different sizes in one pass:
    the same gradient, loss and worker state (BatchNorm's running statistics moved) as one at a time."""
    from pfl.engine.stacked import GradientRequest
    from pfl.engine.trainer import TrainSettings

    data = make_loop(tiny_config("fedavg")).worker.data
    net = _bn_net(data.x[0].numel())
    for w in (_worker().worker, ClientTrainer(net, data, TrainSettings(batch_size=16), seed=0)):
        cids = [c for c in range(data.num_clients) if len(w.split(c).train) % 16 != 1][:4]  # no batch of one
        assert len({len(w.split(c).train) // 16 for c in cids}) > 1  # ragged: clients run out of batches
        start = w.flat.snapshot()
        states = [start + 0.01 * k for k in range(len(cids))]
        expected = []
        for cid, state in zip(cids, states, strict=True):
            grad, loss = w.mean_gradient(cid, state, 1)
            expected.append((grad, loss, w.flat.snapshot()))
        requests = [GradientRequest(cid, state, 1) for cid, state in zip(cids, states, strict=True)]
        trainer, rows = StackedTrainer(w), []
        step = trainer.gradient_step
        trainer.gradient_step = lambda p, *rest, rows=rows, step=step: rows.append(len(p)) or step(p, *rest)
        w.module.eval()  # as an evaluation leaves it: the pass runs in train mode, as the worker's
        trainer.mean_gradients(requests)
        if not trainer.buffer_views:  # the padded pass trains the clients with a batch at each position
            assert sum(rows) == sum(math.ceil(len(w.split(c).train) / 16) for c in cids) and min(rows) < len(cids)
        for r, (grad, loss, after) in zip(requests, expected, strict=True):
            torch.testing.assert_close(r.grad, grad, rtol=0, atol=1e-6)
            assert r.loss == pytest.approx(loss, abs=1e-6)
            torch.testing.assert_close(r.state_out, after, rtol=0, atol=1e-6)
        assert not torch.equal(requests[0].grad, requests[1].grad)


def _dropout_net(dim: int, batch_norm: bool) -> torch.nn.Module:
    from pfl.models.dropout import KeyedDropout

    torch.manual_seed(0)
    norm = [torch.nn.BatchNorm1d(16)] if batch_norm else []
    return torch.nn.Sequential(
        torch.nn.Flatten(), torch.nn.Linear(dim, 16), *norm, torch.nn.ReLU(), KeyedDropout(0.4), torch.nn.Linear(16, 10)
    )


@pytest.mark.parametrize("batch_norm", [False, True])
def test_stacked_fits_with_keyed_dropout_draw_each_clients_sequential_masks(batch_norm):
    from pfl.engine.sam import SAMObjective, sam_context
    from pfl.engine.stacked import GradientRequest, model_problems
    from pfl.engine.trainer import TrainSettings

    data = make_loop(tiny_config("fedavg")).worker.data
    settings = TrainSettings(batch_size=16, lr=0.1, momentum=0.5, weight_decay=1e-3)
    w = ClientTrainer(_dropout_net(data.x[0].numel(), batch_norm), data, settings, seed=0)
    assert model_problems(w) == [] and w.keyed_dropout
    cids = [c for c in range(data.num_clients) if len(w.split(c).train) % 16 not in (1, 2)][:3]
    start = w.flat.snapshot()
    specs = [FitSpec(epochs=2), FitSpec(objective=SAMObjective, context=sam_context(0.05)), FitSpec(purpose="p")]
    first = _sequential(w, cids[0], start, specs[0])[0]
    assert torch.equal(first, _sequential(w, cids[0], start, specs[0])[0])  # the same keys draw the same masks
    _, trainer = _stacked_as_sequential(w, cids, start, specs)
    gradients = [GradientRequest(cid, start, 2) for cid in cids]
    trainer.mean_gradients(gradients)
    for r in gradients:
        grad, loss = w.mean_gradient(r.cid, start, 2)
        torch.testing.assert_close(r.grad, grad, rtol=0, atol=1e-6)
        assert r.loss == pytest.approx(loss, abs=1e-6)
    # Without dropout the fit is another one: the masks are drawn.
    plain = ClientTrainer(_dropout_net(data.x[0].numel(), batch_norm), data, settings, seed=0)
    plain.module.net[-2].p = 0.0
    assert not torch.allclose(_sequential(plain, cids[0], start, specs[0])[0], first, atol=1e-4)


def test_stacked_wrn_batchnorm_fits_equal_the_workers_fits_to_float64_rounding():
    """A Wide ResNet with BatchNorm, clients whose last batches hold 4 and 2 samples: in float32 a stacked
    fit can drift from the sequential one by about 1e-3 within an epoch (a ReLU input within rounding of
    zero takes another sign at one step); in float64 they agree to rounding, so the drift is rounding and
    not a different computation."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        model = {"name": "wrn28_10", "depth": 10, "widen": 1}
        loop = make_loop(tiny_config("fedavg", model=model, client={"batch_size": 16, "lr": 0.05}))
        w, start = loop.worker, loop.init_state
        w.data.x = w.data.x.double()
        specs = {4: FitSpec(indices=w.split(4).train[:36]), 5: FitSpec(indices=w.split(5).train[:18])}
        expected = {cid: _sequential(w, cid, start, spec)[0] for cid, spec in specs.items()}
        requests = [FitRequest.of(w, cid, start, 0, spec) for cid, spec in specs.items()]
        trainer = StackedTrainer(w)
        trainer.train(requests)
        assert trainer.buffer_views and start.dtype == torch.float64
        for r in requests:
            torch.testing.assert_close(r.out, expected[r.cid], rtol=0, atol=1e-12)
            assert not torch.equal(r.out[w.flat.num_params :], start[w.flat.num_params :])  # statistics moved
    finally:
        torch.set_default_dtype(previous)


def test_each_batchnorm_layers_statistics_are_their_own_slice_of_the_flat_buffers():
    """Running statistics of layers of different widths: each named float buffer is its own slice of the
    flat state's buffers (``FlatModule``'s order), and a stacked fit moves each layer's statistics as the
    sequential fit does."""
    from pfl.engine.stacked import _buffer_views
    from pfl.engine.trainer import TrainSettings

    data = make_loop(tiny_config("fedavg")).worker.data
    w = ClientTrainer(_bn_net(data.x[0].numel(), (16, 8)), data, TrainSettings(batch_size=16, lr=0.1), seed=0)
    p = w.flat.num_params
    buffers = dict(w.module.net.named_buffers())
    for k, b in enumerate(buffers.values()):
        if b.is_floating_point():
            b.copy_(torch.arange(b.numel(), dtype=b.dtype).view_as(b) + 100 * k)  # every value tells its buffer
    state = w.flat.snapshot()[p:]
    views = _buffer_views(w.module.net)
    assert [n for n, _, _ in views] == [n for n, b in buffers.items() if b.is_floating_point()]
    assert [sl.stop - sl.start for _, sl, _ in views] == [16, 16, 8, 8] and views[-1][1].stop == w.flat.num_buffers
    for name, sl, shape in views:
        assert torch.equal(state[sl].view(shape), buffers[name]), name
    cids = [c for c in range(data.num_clients) if len(w.split(c).train) % 16 != 1][:3]
    start = w.flat.snapshot()
    requests, _ = _stacked_as_sequential(w, cids, start, [FitSpec(epochs=2), FitSpec(), FitSpec(lr=0.05)])
    assert all(not torch.equal(r.out[p + 32 :], start[p + 32 :]) for r in requests)  # the second layer's moved


def test_a_fit_without_steps_keeps_its_start_and_reports_no_loss():
    """A fit of 0 epochs in a stack with others: its parameters and momentum are its start's, its stats
    count its samples and no step, and its loss is NaN (no batch), as the worker's."""
    loop = _worker()
    w, start = loop.worker, loop.init_state
    buf = torch.full((w.flat.num_params,), 0.5)
    specs = [FitSpec(epochs=0, momentum_buffer=buf), FitSpec(epochs=1)]
    expected = [_sequential(w, k, start, spec) for k, spec in enumerate(specs)]
    requests = [FitRequest.of(w, k, start, 0, spec) for k, spec in enumerate(specs)]
    StackedTrainer(w).train(requests)
    idle, stats = requests[0], expected[0][2]
    assert torch.equal(idle.out, start) and torch.equal(idle.buffer_out, buf) and idle.buffer_out is not buf
    assert (idle.stats.steps, idle.stats.samples_seen, idle.stats.num_samples) == (0, 0, len(w.split(0).train))
    assert math.isnan(idle.stats.loss) and math.isnan(stats.loss) and stats.steps == 0
    assert requests[1].stats.steps > 0 and requests[1].stats.seconds > 0


def test_the_stacked_forward_context_is_the_workers_own_or_bf16_autocast():
    """32-true: the worker's own forward context; bf16-mixed: ``torch.autocast`` to bfloat16 on the
    worker's device, with its cast cache unless the step is captured."""
    import lightning as L

    from pfl.engine.stacked import forward_context

    w = _worker().worker
    assert forward_context(w, cache=True) == w.autocast  # the bound method itself
    mixed = make_loop(
        tiny_config("fedavg", trainer={"precision": "bf16-mixed"}),
        fabric=L.Fabric(accelerator="cpu", precision="bf16-mixed"),
    ).worker
    for cache in (True, False):
        ctx = forward_context(mixed, cache=cache)()
        assert isinstance(ctx, torch.autocast)
        assert (ctx.device, ctx.fast_dtype, ctx._cache_enabled) == ("cpu", torch.bfloat16, cache)


def test_what_keeps_a_model_from_stacking_is_said_in_one_line_each():
    """``net_problems``: nothing for a plain float32 MLP (its defaults: 32-true, no scaler); each reason
    names the layers or the precision and the way out."""
    from pfl.engine.stacked import net_problems

    counted = torch.nn.Module()
    counted.register_buffer("count", torch.zeros((), dtype=torch.long))  # an integer buffer passes as it is
    counted.register_buffer("unset", None)
    assert net_problems(torch.nn.Sequential(torch.nn.Linear(4, 3), counted, torch.nn.Dropout(0.0))) == []  # p = 0
    scaled = torch.nn.Module()
    scaled.register_buffer("scale", torch.ones(3))  # a float buffer of another layer
    plain = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3), torch.nn.Dropout(0.2))  # stacks
    cumulative = torch.nn.BatchNorm1d(3, momentum=None)  # a cumulative average reads num_batches_tracked
    assert net_problems(torch.nn.Sequential(scaled, plain, cumulative, torch.nn.Dropout1d(0.1))) == [
        "the model has float buffers outside BatchNorm layers with a momentum (BatchNorm1d, Module)",
        "the model has dropout drawn from torch's global generator (Dropout, Dropout1d); "
        "pfl.models.dropout.KeyedDropout draws each client's own masks and stacks",
    ]
    linear = torch.nn.Linear(4, 3)
    assert net_problems(linear, "bf16-mixed") == net_problems(linear, "bf16-true") == []
    assert net_problems(linear, scaler=True) == [
        "precision 32-true uses a gradient scaler; use bf16-mixed or a *-true precision"
    ]
    assert net_problems(linear, "transformer-engine-float16") == [
        "precision transformer-engine-float16 has no stacked form; use bf16-mixed or a *-true precision"
    ]


def test_a_bare_sam_context_stacks_as_the_sequential_objective_reads_it():
    """``sam_row`` reads a context as ``SAMObjective`` does: p 2 and the whole vector unless given; a
    subclass stacks only when it says its step is SAM's plain one."""
    from pfl.engine.sam import SAMObjective, sam_context
    from pfl.engine.stacked import SAMRow, sam_row

    assert sam_row(FitSpec(objective=SAMObjective, context={"rho": 0.1})) == SAMRow(0.1, 2.0, None, slice(0, None))
    scale = torch.ones(3)
    given = sam_row(FitSpec(objective=SAMObjective, context=sam_context(0.2, 3.0, scale, slice(1, 3))))
    assert given == SAMRow(0.2, 3.0, scale, slice(1, 3)) and given.scale is scale
    assert sam_row(FitSpec()) is None

    class Other(SAMObjective):  # another step, which does not say it is SAM's
        pass

    assert sam_row(FitSpec(objective=Other, context={"rho": 0.1})) is None


def test_a_trainer_compiles_or_captures_only_when_asked(monkeypatch):
    """``StackedTrainer(worker)``: neither compiled nor captured, even on CUDA; ``compile=True`` hands the
    padded step and the full pass to ``torch.compile`` and pads every step, for every client."""
    from pfl.engine.cuda_graphs import CapturedStep

    w = _worker().worker
    monkeypatch.setattr(type(w), "device", property(lambda self: torch.device("cuda", 0)), raising=False)
    plain = StackedTrainer(w)
    assert (plain.compiled, plain.captured, plain.static_width, plain.stack_rows) == (False, False, False, "active")
    assert not isinstance(plain.step, CapturedStep)
    compiled_fns = []
    monkeypatch.setattr(torch, "compile", lambda fn, **kwargs: compiled_fns.append(kwargs) or fn)
    compiled = StackedTrainer(w, compile=True)
    assert compiled.compiled is True and compiled.captured is False
    assert (compiled.static_width, compiled.stack_rows) == (True, "all")
    assert compiled_fns == [{"dynamic": True}, {"dynamic": True}]  # the step and the full pass


def _regression_bn_worker() -> ClientTrainer:
    """A regression worker (targets of shape (B,), outputs (B, 1)) with a BatchNorm MLP: its stacked steps
    are the unpadded ones."""
    from pfl.config import DataConfig
    from pfl.data import build_data
    from pfl.engine.trainer import TrainSettings

    data = build_data(DataConfig(source="synthetic_regression", num_clients=6, val_frac=0.2, test_frac=0.3), 0)
    torch.manual_seed(0)
    dim = data.x[0].numel()
    net = torch.nn.Sequential(
        torch.nn.Linear(dim, 16), torch.nn.BatchNorm1d(16), torch.nn.ReLU(), torch.nn.Linear(16, 1)
    )
    return ClientTrainer(net, data, TrainSettings(batch_size=8, lr=0.05, momentum=0.5), seed=0)


def test_stacked_regression_fits_squeeze_the_outputs_to_the_targets():
    w = _regression_bn_worker()
    assert w.task == "regression" and w.data.y.dim() == 1
    cids = [c for c in range(6) if len(w.split(c).train) % 8 != 1][:3]
    requests, trainer = _stacked_as_sequential(w, cids, w.flat.snapshot(), [FitSpec(epochs=2), FitSpec(), FitSpec()])
    assert trainer.buffer_views and all(r.stats.loss > 0 for r in requests)


def test_equal_epochs_stack_epoch_by_epoch_and_unequal_ones_each_at_its_own_pace():
    """Two clients of 3 and 1 batches: with 2 epochs each, the second waits for the first's epoch (rows 2, 1,
    1, then again); with 3 and 1 epochs each goes through its batches at its own pace (2, then 1 eight times)."""
    w = _worker().worker
    pool = torch.arange(64)  # pool samples (FitSpec.indices)
    rows = []
    for epochs, expected in (((2, 2), [2, 1, 1, 2, 1, 1]), ((3, 1), [2, 1, 1, 1, 1, 1, 1, 1, 1])):
        trainer = StackedTrainer(w)
        step = trainer.step
        trainer.step = lambda p, *rest, step=step: rows.append(len(p)) or step(p, *rest)
        specs = [FitSpec(indices=pool[:48], epochs=epochs[0]), FitSpec(indices=pool[48:64], epochs=epochs[1])]
        requests = [FitRequest.of(w, k, w.flat.snapshot(), 0, spec) for k, spec in enumerate(specs)]
        trainer.train(requests)
        assert rows == expected, epochs
        rows.clear()


def test_stateful_terms_write_their_state_back_after_a_stacked_fit():
    """PGFed's auxiliary risk keeps each client's α; a stacked fit writes each client's trained α back into
    its own term, as the sequential fit leaves it."""
    loop = _worker()
    w, start = loop.worker, loop.init_state
    p = w.flat.num_params
    g = torch.Generator().manual_seed(3)

    def terms(k: int) -> list[Term]:
        aux, gbar = (0.01 * torch.randn(p, generator=g) for _ in range(2))
        c, alpha = torch.randn(4, generator=g), torch.rand(4, generator=g)
        return [AuxiliaryRisk(aux, c, alpha, 0.1 * (k + 1), gbar=gbar, clip=True)]

    drawn = [terms(k) for k in range(2)]
    before = [t[0].alpha.clone() for t in drawn]
    expected = []
    for k, t in enumerate(drawn):
        _sequential(w, k, start, FitSpec(terms=t))
        expected.append(t[0].alpha.clone())
        t[0].alpha.copy_(before[k])
    requests = [FitRequest.of(w, k, start, 0, FitSpec(terms=t)) for k, t in enumerate(drawn)]
    StackedTrainer(w).train(requests)
    for k, t in enumerate(drawn):
        torch.testing.assert_close(t[0].alpha, expected[k], rtol=0, atol=1e-6)
        assert not torch.equal(t[0].alpha, before[k])  # α moved


def test_each_stacked_fit_reports_its_share_of_the_groups_seconds(monkeypatch):
    import types

    from pfl.engine import stacked

    clock = iter([10.0, 16.0])
    monkeypatch.setattr(stacked, "time", types.SimpleNamespace(perf_counter=lambda: next(clock)))
    w = _worker().worker
    requests = [FitRequest.of(w, k, w.flat.snapshot(), 0, FitSpec()) for k in range(3)]
    StackedTrainer(w).train(requests)
    assert [r.stats.seconds for r in requests] == [2.0, 2.0, 2.0]  # 6 s over 3 clients


def test_the_full_pass_of_a_one_sample_client_is_its_one_batch_and_of_an_empty_one_nothing(monkeypatch):
    """Clients of one sample and of none beside a larger one: one batch, its gradient and loss that sample's;
    no batch, a zero gradient and loss, as the worker's."""
    import dataclasses

    from pfl.engine.stacked import GradientRequest

    w = _worker().worker
    split = w.split
    sizes = {0: 1, 2: 0}
    monkeypatch.setattr(
        w, "split", lambda cid: dataclasses.replace(split(cid), train=split(cid).train[: sizes.get(cid, 10**6)])
    )
    start = w.flat.snapshot()
    expected = [w.mean_gradient(cid, start, 0) for cid in (0, 1, 2)]
    requests = [GradientRequest(cid, start, 0) for cid in (0, 1, 2)]
    trainer, rows = StackedTrainer(w), []
    step = trainer.gradient_step
    trainer.gradient_step = lambda p, *rest: rows.append(len(p)) or step(p, *rest)
    trainer.mean_gradients(requests)
    for r, (grad, loss) in zip(requests, expected, strict=True):
        torch.testing.assert_close(r.grad, grad, rtol=0, atol=1e-6)
        assert r.loss == pytest.approx(loss, abs=1e-6)
    assert [len(w.split(c).train) for c in (0, 2)] == [1, 0] and expected[0][1] > 0 and expected[2][1] == 0
    assert rows[0] == 2 and sum(rows) == 1 + math.ceil(len(w.split(1).train) / w.settings.batch_size)  # none for 2


def test_every_client_in_every_padded_step_with_augmentation_trains_as_alone():
    """As ``trainer.compile`` runs it: every step pads to the batch size and holds every client, those
    without a batch at it included; only the clients with a batch are augmented, each from its own
    generator, and each fit equals the worker's."""
    loop = _worker()
    w, start = loop.worker, loop.init_state
    assert w.augment is not None
    specs = [FitSpec(epochs=2), FitSpec(epochs=1), FitSpec(indices=w.split(2).train[:20])]
    expected = [_sequential(w, k, start, spec)[0] for k, spec in enumerate(specs)]
    trainer, rows = StackedTrainer(w), []
    trainer.static_width, trainer.stack_rows = True, "all"
    step = trainer.step
    trainer.step = lambda p, *rest: rows.append(len(p)) or step(p, *rest)
    requests = [FitRequest.of(w, k, start, 0, spec) for k, spec in enumerate(specs)]
    trainer.train(requests)
    assert set(rows) == {3} and max(r.stats.steps for r in requests) > min(r.stats.steps for r in requests)
    for r, state in zip(requests, expected, strict=True):
        torch.testing.assert_close(r.out, state, rtol=0, atol=1e-5)


def test_pgfed_and_pgfed_ce_auxiliary_risks_stack_apart_each_as_alone():
    """PGFed's term (ḡ, its ḡᵀθ at each step), PGFed-CE's with one constant per client j and with one
    scalar: three groups in one call (a group per kind and shape), a client alone in the last; each fit
    and each α as the sequential one."""
    loop = _worker()
    w, start = loop.worker, loop.init_state
    p = w.flat.num_params
    g = torch.Generator().manual_seed(4)

    def risk(k: int, kind: str) -> AuxiliaryRisk:
        aux, c, alpha = 0.01 * torch.randn(p, generator=g), torch.randn(4, generator=g), torch.rand(4, generator=g)
        if kind == "gbar":
            given = {"gbar": 0.01 * torch.randn(p, generator=g)}
        else:  # PGFed-CE: one constant per client j, or one scalar
            given = {"dot": torch.randn(4 if kind == "per_client" else 1, generator=g)}
        return AuxiliaryRisk(aux, c, alpha, 0.1 * (k + 1), clip=True, **given)

    kinds = ["gbar", "per_client", "gbar", "per_client", "scalar"]
    terms = [risk(k, kind) for k, kind in enumerate(kinds)]
    assert len({t.stack_key() for t in terms}) == 3
    before = [t.alpha.clone() for t in terms]
    expected = []
    for k, t in enumerate(terms):
        state = _sequential(w, k, start, FitSpec(terms=[t]))[0]
        expected.append((state, t.alpha.clone()))
        t.alpha.copy_(before[k])
    requests = [FitRequest.of(w, k, start, 0, FitSpec(terms=[t])) for k, t in enumerate(terms)]
    StackedTrainer(w).train(requests)
    for r, t, (state, alpha) in zip(requests, terms, expected, strict=True):
        torch.testing.assert_close(r.out, state, rtol=0, atol=1e-5)
        torch.testing.assert_close(t.alpha, alpha, rtol=0, atol=1e-6)


def test_plgu_grep_body_fits_stack_only_without_eq_11s_plain_step():
    """PLGU-GRep's body step is SAM's own without ``pre_step`` (it stacks, with its region and Λ); with
    Eq. 11's plain step first it has no stacked form."""
    from pfl.engine.sam import sam_context
    from pfl.engine.stacked import SAMRow, sam_row
    from pfl.methods.plgu import GRepBodyObjective

    scale, body = torch.ones(20), slice(0, 12)
    plain = FitSpec(objective=GRepBodyObjective, context=sam_context(0.05, 2.0, scale, body, pre_step=False))
    assert sam_row(plain) == SAMRow(0.05, 2.0, scale, body) and spec_problem(plain) is None
    extra = FitSpec(objective=GRepBodyObjective, context=sam_context(0.05, 2.0, scale, body, pre_step=True))
    assert sam_row(extra) is None and spec_problem(extra) == "a custom objective (GRepBodyObjective)"


@pytest.mark.parametrize("settings", [{"nesterov": True, "momentum": 0.9}, {"dampening": 0.5, "momentum": 0.9}])
def test_a_personal_model_trained_by_anything_but_plain_sgd_is_refused_by_the_stacked_step(settings):
    """PLGU-LF's θ step stacks as heavy-ball SGD (``PersonalRow``): Nesterov or dampened momentum would be
    another step, so ``stacked_personal`` refuses it rather than train θ otherwise."""
    w = _worker().worker
    spec = _lwsam_spec(w, w.flat.snapshot(), 0.05, 0.1, 0.9)
    leaf = spec.context["theta_params"]
    spec.context["theta_optimizer"] = torch.optim.SGD([leaf], lr=0.1, **settings)
    with pytest.raises(AssertionError, match="the stacked θ step is plain"):
        FitRequest.of(w, 0, w.flat.snapshot(), 0, spec)
