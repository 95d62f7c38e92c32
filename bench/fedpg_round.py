"""FedPG's server cost per round against its clients' training, at the paper's scale.

    python -m bench.fedpg_round [--threads 1] [--repeats 3]

The paper's setting: 100 clients, 10 online per round, so with history the server solves over
K = 10 client rows + ∇F + 90 stored rows = 101, for the FMNIST MLP (784-128-128-10, 118 k parameters)
and FedPG's CIFAR-10 CNN (fedpg_cnn: conv 64, conv 64, FC 384, FC 192: 0.8 M parameters). Server: ``FedPG.aggregate`` on
synthetic uploads (Gram product, min-norm solve, update, history; with γ > 0 also the 10 personalized
directions), median of ``--repeats``. Clients: one real local update (train loss at w, then 5 epochs
of batch 50 over 525 samples, FMNIST's 700 per client at 75/25) through pfl's worker on synthetic
images, times the 10 clients of a round (they run one after another in a one-process simulation).
Times are CPU seconds of the process (``time.process_time``): on a shared machine wall time also
counts other jobs; with one thread CPU time is what the work costs.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from pfl.config import ClientConfig, RunConfig, TrackingConfig, TrainerConfig
from pfl.data import ClientSplit, FederatedData
from pfl.engine.flat import ModelLayout
from pfl.methods import ServerContext, Upload
from pfl.methods.fedpg import FedPG
from pfl.models import ModelConfig
from pfl.runner.assembly import build_loop
from pfl.runner.plan import plan_run

ONLINE, CLIENTS, TRAIN = 10, 100, 525
SETTINGS = {
    "mlp (FMNIST, 118 k)": (ModelConfig(name="mlp", hidden=[128, 128]), (1, 28, 28)),
    "fedpg_cnn (CIFAR-10, 0.8 M)": (ModelConfig(name="fedpg_cnn"), (3, 32, 32)),
}


def synthetic_data(shape: tuple[int, ...]) -> FederatedData:
    g = torch.Generator().manual_seed(0)
    pool = TRAIN + 100
    y = torch.randint(0, 10, (pool,), generator=g)
    x = (torch.rand(10, *shape, generator=g)[y] + 0.5 * torch.randn(pool, *shape, generator=g)).clamp_(0, 1)
    split = ClientSplit(train=torch.arange(TRAIN), test=torch.arange(TRAIN, pool))
    return FederatedData("synthetic", x, y, 10, [split] * CLIENTS, global_test=torch.arange(TRAIN, pool))


def client_seconds(model: ModelConfig, shape: tuple[int, ...]) -> tuple[float, int]:
    cfg = RunConfig(
        method=FedPG(),
        trainer=TrainerConfig(rounds=1, clients_per_round=ONLINE, progress=False),
        client=ClientConfig(epochs=5, batch_size=50, lr=0.05),
        model=model,
        tracking=TrackingConfig(wandb=False),
    )
    loop = build_loop(plan_run(cfg, synthetic_data(shape)))
    payload = loop.method.payload(loop.server, 0)
    loop.method.local_update(loop.client(0), payload)  # warm-up
    started = time.process_time()
    loop.method.local_update(loop.client(1), payload)
    return time.process_time() - started, loop.server.layout.num_params


def server_seconds(p: int, gamma: float, repeats: int) -> list[float]:
    g = torch.Generator().manual_seed(1)
    shared = torch.randn(p, generator=g) * 0.01
    times = []
    for r in range(repeats):
        method = FedPG(rescale=True, gamma=gamma)
        layout = ModelLayout(p, 0, (("0", slice(0, p)),), torch.device("cpu"))
        server = ServerContext(r, CLIENTS, ONLINE, layout, torch.zeros(p))
        server.state = method.init_server(server)
        server["history"] = {c: torch.randn(p, generator=g) * 0.01 + shared for c in range(ONLINE, CLIENTS)}
        w = server["global"]
        uploads = {}
        for c in range(ONLINE):
            loss = {"loss": torch.rand(1, generator=g) + 1}
            uploads[c] = Upload(w - (torch.randn(p, generator=g) * 0.01 + shared), 525.0, loss)
        started = time.process_time()
        method.aggregate(server, uploads)
        times.append(time.process_time() - started)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"CPU seconds, {args.threads} thread(s)")
    print(f"| model | K | client update (s) | {ONLINE} clients (s) | server γ=0 (s) | server γ=0.6 (s) |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, (model, shape) in SETTINGS.items():
        one, p = client_seconds(model, shape)
        plain = statistics.median(server_seconds(p, 0.0, args.repeats))
        personal = statistics.median(server_seconds(p, 0.6, args.repeats))
        k = CLIENTS + 1
        print(f"| {name} | {k} | {one:.2f} | {ONLINE * one:.1f} | {plain:.2f} | {personal:.2f} |", flush=True)


if __name__ == "__main__":
    main()
