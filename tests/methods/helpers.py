"""Helpers shared by the method tests: a round that keeps what was exchanged, small runs, hand gradients
and the BatchNorm model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from jsonargparse import ArgumentParser
from torch import nn
from torch.func import functional_call

from pfl.engine.flat import ModelLayout
from pfl.federation.dispatch import VectorizedDispatcher
from pfl.federation.loop import FederatedLoop
from pfl.methods import ClientContext, ServerContext, Upload, methods, weighted_mean
from tests.conftest import make_loop, tiny_config
from tests.helpers.same_runs import assert_close, assert_same_metrics


def exchanged_round(loop: FederatedLoop) -> tuple[dict[int, dict], dict[int, dict[str, Any]]]:
    """One round exactly as ``FederatedLoop.run_round`` does it, returning (payloads, results)."""
    sampled = loop.sampled_clients()
    payloads, results = {}, {}
    for cid in sampled.tolist():
        payloads[cid] = {k: v.clone() for k, v in loop.method.payload(loop.server, cid).items()}
        results[cid] = loop.method.local_update(loop.client(cid), payloads[cid])
    loop.method.aggregate(loop.server, results)
    for cid in sampled.tolist():
        if not loop.clients.get(cid):
            loop.clients.pop(cid, None)
    loop.progress.round += 1
    return payloads, results


def lockstep_as_sequential(cfg) -> FederatedLoop:
    """``cfg``'s run with its clients trained in lockstep, after checking that its server state, clients'
    states and last metrics equal those of the same run trained one client after another."""
    seq, vec = make_loop(cfg), make_loop(cfg)
    vec.dispatcher = VectorizedDispatcher(vec.worker, vec.clients, vec.init_state, vec.evals.trained, False)
    seq.fit(), vec.fit()
    assert_close(vec.server.state, seq.server.state, "server")
    assert_close(dict(vec.clients.items()), dict(seq.clients.items()), "clients")
    assert_same_metrics(vec.history[-1], seq.history[-1])
    return vec


def server_means_by_hand(loop: FederatedLoop, uploads: dict[int, Upload]) -> tuple[torch.Tensor, torch.Tensor]:
    """The plain mean Σ w_i / |S| and the sample-weighted mean Σ n_i w_i / Σ n_i of a round's uploaded
    states, n_i the client's training-set size read from the data (not from ``Upload.weight``); the round's
    clients differ in size, so the two differ."""
    sizes = {c: len(loop.worker.data.clients[c].train) for c in uploads}
    assert len(set(sizes.values())) > 1, sizes
    plain = sum(uploads[c].state for c in uploads) / len(uploads)
    weighted = sum(sizes[c] * uploads[c].state for c in uploads) / sum(sizes.values())
    assert not torch.allclose(plain, weighted, atol=1e-4)
    return plain, weighted


def tensor_bytes(exchanged: Any) -> int:
    """Bytes of the tensors in a payload dict or an upload (the weight is not sent)."""
    if isinstance(exchanged, Upload):
        return tensor_bytes({"state": exchanged.state, **exchanged.extras})
    return sum(v.numel() * v.element_size() for v in exchanged.values() if isinstance(v, torch.Tensor))


# -- FedPG / FedMGDA+: a bare server over a P-dimensional parameter vector --------------------------
def bare_server(method, p: int, num_clients: int = 8, round_idx: int = 0) -> ServerContext:
    layout = ModelLayout(p, 0, (("0", slice(0, p)),), torch.device("cpu"))
    server = ServerContext(round_idx, num_clients, num_clients, layout, torch.zeros(p, dtype=torch.float64))
    server.state = method.init_server(server)
    return server


# -- FedORA and the baselines of its table (IFCA, FeSEM, FedAMP, FedU) --------------------------------
VAL = {"val_frac": 0.2}  # a validation split: FedORA selects on it, PAGE's and Dap-FL's agents score on it


def run(loop, rounds):
    for _ in range(rounds):
        loop.run_round()
    return loop


def assert_global_is_fedavgs(loop: FederatedLoop, rounds: int = 3, **groups: Any) -> None:
    """Runs ``loop`` beside FedAvg on the same tiny federation (``groups``): after every round their
    global models are bit-identical."""
    fedavg = make_loop(tiny_config("fedavg", **groups))
    for r in range(rounds):
        loop.run_round()
        fedavg.run_round()
        assert torch.equal(loop.server["global"], fedavg.server["global"]), f"round {r}"


def resumed_after(cfg, rounds: int, run_dir: Path) -> tuple[FederatedLoop, FederatedLoop]:
    """A loop run ``rounds`` rounds and checkpointed in ``run_dir``, and a fresh loop resumed from it."""
    first = run(make_loop(cfg, run_dir=run_dir), rounds)
    first.checkpointer.save()
    resumed = make_loop(cfg)
    assert resumed.checkpointer.resume(run_dir)
    return first, resumed


def personal(loop):
    return torch.stack(
        [loop.method.personal_state(loop.server, loop.client(c)) for c in range(loop.server.num_clients)]
    )


NEW = {"val_frac": 0.2, "num_clients": 8, "new_clients": 0.25}


def new_client_context(loop, j):
    return ClientContext(loop.server.num_clients + j, loop.round, loop.worker, {}, loop.init_state)


# -- SplitGP's routed evaluation ---------------------------------------------------------------------
def _trained(threshold: float | None, **groups):
    loop = make_loop(tiny_config("splitgp", {"entropy_threshold": threshold}, **groups))
    loop.run_round()
    loop.run_round()
    metrics = loop.evaluate()
    return loop, metrics, loop.client_rows


# -- PAGE, Dap-FL and their shared RL tuning (tests/methods/test_{page,dapfl,rl_tuning}.py) --------------
REPO_ROOT = Path(__file__).resolve().parents[2]
RANGE = {"lr_min": 0.01, "lr_max": 0.1, "epoch_max": 3}
FAST_AGENTS = {"warmup": 2, "ddpg_batch_size": 2, **RANGE}


def fixed_client_action(cid: int) -> torch.Tensor:
    """Agent-space actions spread over the range: lr 0.0145 + 0.0045·cid, epochs 1, 1, 2, 2, 2, 3."""
    return torch.tensor([-0.9 + 0.1 * cid, -0.9 + 0.3 * cid])


def reference_round(loop, global_state, hparams, weights):
    """One FedAvg round with per-client learning rates, epochs and aggregation weights, trained on
    a separate loop over the same federation and seed (so the same keyed batches)."""
    trained = []
    for cid in range(loop.server.num_clients):
        ctx = ClientContext(cid, loop.round, loop.worker, {}, loop.init_state)
        lr, epochs = hparams[cid]
        trained.append(ctx.fit(global_state, lr=lr, epochs=epochs))
    loop.progress.round += 1
    return weighted_mean(trained, weights), trained


# -- FedSAM, PLGU and pFedHN (tests/methods/test_{fedsam,plgu,pfedhn}.py) -------------------------------
SAM_HALF = {"fraction": 0.5}
SAM_MOMENTUM = {"momentum": 0.9, "weight_decay": 1e-3}


def fit_half_momentum(name: str, args: dict | None = None, **groups) -> FederatedLoop:
    """A whole tiny run, half the clients a round, the client optimizer with momentum and weight decay."""
    loop = make_loop(tiny_config(name, args, **{"trainer": SAM_HALF, "client": SAM_MOMENTUM, **groups}))
    loop.fit()
    return loop


def equal_servers(a: FederatedLoop, b: FederatedLoop) -> bool:
    """The two server states hold the same keys and bit-identical tensors (one level of nesting)."""
    if a.server.state.keys() != b.server.state.keys():
        return False
    for key, value in a.server.state.items():
        other = b.server[key]
        if isinstance(value, dict):
            if value.keys() != other.keys() or not all(torch.equal(value[k], other[k]) for k in value):
                return False
        elif not torch.equal(value, other):
            return False
    return True


# -- every registered method's options (tests/methods/test_{base,choices,rl_tuning}.py) ------------------
REGISTERED = list(methods())


def method_options(cls: type) -> dict[str, Any]:
    """The ``method.*`` options jsonargparse builds for ``cls``: name → default."""
    parser = ArgumentParser(exit_on_error=False)
    parser.add_class_arguments(cls, "method")
    return {a.dest.removeprefix("method."): a.default for a in parser._actions if a.dest.startswith("method.")}


HALF = {"fraction": 0.5}


# FedProx's synthetic data: every input feature varies, so the first weight (input feature 0) has a
# gradient; on digits feature 0 is a corner pixel, always 0, and freezing it or not shows nowhere.
SYNTHETIC = {"source": "synthetic", "num_clients": 6}


def _fit(name, args=None, **groups):
    loop = make_loop(tiny_config(name, args, **{"trainer": HALF, **groups}))
    loop.fit()
    return loop


def _one_client_loop(name, args, rounds=1, data=None, **client):
    cfg = tiny_config(
        name,
        args,
        data={"num_clients": 1, "min_samples": 1, **(data or {})},
        client={"epochs": 1, "batch_size": 16, "lr": 0.1, **client},
        trainer={"rounds": rounds},
    )
    loop = make_loop(cfg)
    loop.fit()
    return cfg, loop


def _grads(net, params, x, y):
    loss = F.cross_entropy(functional_call(net, params, (x,)), y)
    return torch.autograd.grad(loss, list(params.values()))


ONE_CLIENT = {"num_clients": 1, "min_samples": 1}


def _one_client(name, args, rounds=1, **client):
    cfg = tiny_config(
        name,
        args,
        data=ONE_CLIENT,
        client={"epochs": 1, "batch_size": 16, "lr": 0.1, **client},
        trainer={"rounds": rounds},
    )
    loop = make_loop(cfg)
    loop.fit()
    return cfg, loop


def _full_grad(loop, cid, state, idx=None):
    """∇f and f of client ``cid`` at ``state`` over its train split (or ``idx``), by plain autograd."""
    flat, data = loop.worker.flat, loop.worker.data
    params = state[: flat.num_params].clone().requires_grad_(True)
    idx = data.clients[cid].train if idx is None else idx
    logits = functional_call(loop.worker.module.net, flat.param_dict(params), (data.x[idx],))
    loss = F.cross_entropy(logits, data.y[idx])
    (grad,) = torch.autograd.grad(loss, params)
    return grad, float(loss.detach())


def bn_mlp(cfg, input_shape, num_classes):
    """An MLP with one BatchNorm layer: 32 float buffers (running mean and variance of 16 features)."""
    width = int(torch.tensor(input_shape).prod())
    return nn.Sequential(nn.Flatten(), nn.Linear(width, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, num_classes))


def _bare_server(p: int = 3) -> ServerContext:
    layout = ModelLayout(p, 0, (("0", slice(0, p)),), torch.device("cpu"))
    return ServerContext(0, 4, 2, layout, torch.zeros(p, dtype=torch.float64))


# -- IFCA and FeSEM: k cluster starts, row 0 the shared initialisation, the others independent draws ----------
BN_CNN = {"name": "cnn_bn"}  # BatchNorm after each conv; convs and linears in PyTorch's default init
GN_WRN = {"name": "wrn28_10", "depth": 10, "widen": 1, "norm": "group"}  # GroupNorm; Kaiming-normal convs


def cluster_loop(method: str, model: dict, clusters: int = 3, seed: int = 0) -> FederatedLoop:
    return make_loop(tiny_config(method, {"clusters": clusters}, model=model, seed=seed, eval={"reference": "none"}))


def assert_independent_cluster_starts(loop: FederatedLoop, starts: torch.Tensor, model: dict) -> None:
    """``starts`` (k, S) of ``loop``'s network (BN_CNN or GN_WRN): row 0 is the shared initialisation; every
    row keeps its buffers; every norm layer starts at weight 1, bias 0; every conv and linear weight of a
    row j > 0 follows its layer's initial distribution, is no permutation of row 0's and differs from
    every other row's."""
    from pfl.models.norms import NORM_TYPES

    net, slices, p = loop.worker.module.net, loop.worker.flat.param_slices, loop.server.layout.num_params
    init, k = loop.init_state, len(starts)
    assert k >= 3 and torch.equal(starts[0], init)
    assert torch.equal(starts[:, p:], init[p:].expand(k, -1))  # BatchNorm running statistics: the shared init's
    norms = [(name, m) for name, m in net.named_modules() if isinstance(m, NORM_TYPES)]
    for name, module in norms:
        assert torch.equal(starts[:, slices[f"{name}.weight"]], torch.ones(k, module.weight.numel())), name
        assert torch.equal(starts[:, slices[f"{name}.bias"]], torch.zeros(k, module.bias.numel())), name
    kinds = {type(m).__name__ for _, m in norms}
    for name, module in net.named_modules():
        if not isinstance(module, (nn.Linear, nn.Conv2d)):
            continue
        kinds.add(type(module).__name__)
        w = starts[:, slices[f"{name}.weight"]]
        fan_in, fan_out = module.weight[0].numel(), module.weight.shape[0] * module.weight[0, 0].numel()
        kaiming_normal = isinstance(module, nn.Conv2d) and model is GN_WRN
        bound = 1 / fan_in**0.5  # PyTorch's default: kaiming_uniform(a=√5), U(±1/√fan_in) for weight and bias
        std = (2 / fan_out) ** 0.5 if kaiming_normal else bound / 3**0.5
        for j in range(1, k):
            assert not torch.equal(w[j].sort().values, w[0].sort().values), (name, j)  # no permutation of row 0
            assert all(not torch.equal(w[j], w[i]) for i in range(j)), (name, j)
            if w.shape[1] >= 500:
                assert 0.85 < float(w[j].std()) / std < 1.15, (name, j)
            if not kaiming_normal:
                assert float(w[j].abs().max()) <= bound, (name, j)
        if module.bias is not None:
            b = starts[:, slices[f"{name}.bias"]]
            if model is GN_WRN:  # wrn zero-initialises its classifier's bias
                assert torch.equal(b, torch.zeros_like(b)), name
            else:
                assert float(b.abs().max()) <= bound and not torch.equal(b[1], b[2]), name
    assert kinds >= {"Conv2d", "Linear"} and kinds & {"BatchNorm2d", "GroupNorm"}, kinds
