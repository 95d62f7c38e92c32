"""Fast paths compute exactly what the slow paths compute; the benchmark compares like with like."""

from __future__ import annotations

import torch

from bench.common import bench_config, mnist_like
from bench.common import make_loop as make_bench_loop
from bench.overhead import PlainFedAvg
from bench.scaling import store_bytes
from bench.vmap import vmap_fedavg_round
from pfl.config import RunConfig
from pfl.engine.terms import Proximal
from pfl.engine.trainer import FitSpec
from pfl.federation.loop import FederatedLoop
from pfl.methods import methods
from pfl.models import ModelConfig
from pfl.runner.assembly import build_loop
from pfl.runner.plan import plan_run
from pfl.seeding import seed_everything
from tests.conftest import make_loop, tiny_config


def _small_bench_config(method: str = "fedavg", num_clients: int = 6, per_round: int = 3) -> RunConfig:
    cfg = bench_config(method, "mlp", num_clients, per_round, epochs=1, batch_size=16)
    cfg.model = ModelConfig(name="mlp", hidden=[16])
    return cfg


def _small_bench_loop(method: str = "fedavg", num_clients: int = 6, per_round: int = 3) -> FederatedLoop:
    return build_loop(plan_run(_small_bench_config(method, num_clients, per_round), mnist_like(num_clients)))


def test_plain_reference_does_the_same_steps_as_the_loop():
    cfg = _small_bench_config()
    loop = build_loop(plan_run(cfg, mnist_like(6)))
    plain = PlainFedAvg(cfg, loop.worker.data)
    for _ in range(2):
        loop.run_round(), plain.run_round()
    torch.testing.assert_close(loop.server["global"][: loop.flat.num_params], plain.flat(), rtol=1e-5, atol=1e-6)
    assert not torch.equal(plain.flat(), loop.init_state[: loop.flat.num_params])


def test_fit_without_terms_equals_fit_through_the_flat_gradient():
    loop = make_loop(tiny_config("fedavg", client={"momentum": 0.9, "weight_decay": 1e-3}))
    w, start = loop.worker, loop.init_state
    w.train(2, start, 0)
    fast = w.snapshot()
    w.train(2, start, 0, FitSpec(terms=[Proximal(start[: w.flat.num_params], 0.0)]))  # a zero term: the flat path
    torch.testing.assert_close(fast, w.snapshot(), rtol=0, atol=1e-6)
    assert not torch.equal(fast, start)
    # After a fit without terms, backward writes into the flat gradient again.
    w.flat.zero_grad()
    w.module.training_step((w.data.x[:4], w.data.y[:4])).backward()
    assert w.flat.grads.abs().sum() > 0


def test_seed_everything_gives_the_manual_seed_stream():
    seed_everything(3, "x")
    a = torch.rand(5)
    from pfl.seeding import derive_seed

    torch.manual_seed(derive_seed(3, "x"))
    assert torch.equal(a, torch.rand(5))


def test_vectorized_clients_equal_sequential_fedavg():
    loop = _small_bench_loop()
    loop.run_round()
    vec = vmap_fedavg_round(loop, loop.round)
    loop.run_round()
    torch.testing.assert_close(vec, loop.server["global"][: loop.flat.num_params], rtol=1e-5, atol=1e-6)


def test_client_store_holds_only_the_methods_state():
    fedavg, ditto = _small_bench_loop("fedavg", 12, 3), _small_bench_loop("ditto", 12, 3)
    for _ in range(3):
        fedavg.run_round(), ditto.run_round()
    assert store_bytes(fedavg) == 0
    model = ditto.init_state.numel() * ditto.init_state.element_size()
    assert len(ditto.clients) >= 3 and store_bytes(ditto) == model * len(ditto.clients)


def test_every_registered_method_runs_in_the_benchmark_setup():
    for name in methods():
        loop = make_bench_loop(bench_config(name, "mlp", 4, 2, epochs=1), mnist_like(4))
        loop.run_round()
        assert loop.progress.train_samples > 0


def test_the_handoff_bench_times_the_same_gradient_calls_with_and_without_the_handoff():
    from bench.handoff import Immediate, NoPass, gradient_calls, handoff_costs
    from pfl.engine.lockstep import LockstepTrainer

    w = _small_bench_loop().worker
    rows = handoff_costs(w, (1, 3), calls=2, repeats=1)  # asserts every lockstep call was handed off
    assert [r["clients"] for r in rows] == [1, 3]
    assert all(r["handoff_us"] == r["lockstep_us"] - r["at_once_us"] and r["at_once_us"] > 0 for r in rows)
    immediate = Immediate(w, NoPass(w))
    w.flat.grads.fill_(1.0)
    gradient_calls(2)(LockstepTrainer(w, immediate, 0))
    # the same path as in lockstep (a stacked call each), served without a handoff: NoPass's zero gradient
    assert (immediate.stacked_batch_gradients, immediate.sequential_gradients) == (2, 0)
    assert not w.flat.grads.any()
