"""Lockstep's handoff (``pfl.engine.lockstep``): what a stacked ``client.gradient`` call of a method's own
loop (pFedMe, Per-FedAvg) costs beyond its computation, with n clients in the round.

The stacked pass is replaced by one that computes nothing (zero gradients), so a lockstep round of such
calls measures the handoffs between the client threads plus each call's bookkeeping (its batch, the
saved and restored generators and parameters). The same calls served at once, without threads
(``Immediate``), measure the bookkeeping alone. Both run on the same worker, alternated, best of a few.

    python -m bench.handoff [--clients 5,20,50] [--calls 50]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence

import torch

from bench.common import bench_config, make_loop, mnist_like
from pfl.engine.lockstep import Lockstep, LockstepTrainer
from pfl.engine.stacked import BatchGradientRequest, FitRequest, GradientRequest, StackedTrainer
from pfl.engine.trainer import ClientTrainer


class NoPass(StackedTrainer):
    """A stacked trainer whose gradient calls compute nothing: zero gradients, zero losses."""

    def batch_gradients(self, reqs: Sequence[BatchGradientRequest]) -> None:
        for r in reqs:
            r.grad, r.loss = torch.zeros_like(r.params), r.params.new_zeros(())


class Immediate(Lockstep):
    """Serves each request at once on the calling thread: a call's bookkeeping without a handoff."""

    def wait_for(self, slot: int, request: FitRequest | GradientRequest | BatchGradientRequest) -> None:
        assert isinstance(request, BatchGradientRequest)
        self.trainer.batch_gradients([request])


CLIENTS = (5, 20, 50)  # clients in the round (make bench and the command's default)
CALLS = 50  # gradient calls per client


def bench_worker() -> ClientTrainer:
    """The worker the handoff is timed on: FedAvg's MLP on an MNIST-shaped split of 100 clients."""
    return make_loop(bench_config("fedavg", "mlp", 100, 10), mnist_like(100)).worker


def gradient_calls(calls: int) -> Callable[[LockstepTrainer], None]:
    """A local update of ``calls`` gradient calls on one batch (a method's own loop, its work removed)."""

    def update(trainer: LockstepTrainer) -> None:
        batch = torch.arange(4)
        for _ in range(calls):
            trainer.gradient(batch)

    return update


def handoff_costs(worker: ClientTrainer, clients: Sequence[int], calls: int, repeats: int = 3) -> list[dict]:
    """Per n in ``clients``: microseconds per client-call in lockstep and served at once (best of
    ``repeats``, the two alternated), and the handoff's share of the lockstep call."""
    rows = []
    update = gradient_calls(calls)
    for n in clients:
        best = {"lockstep": float("inf"), "at_once": float("inf")}
        for _ in range(repeats):
            lockstep = Lockstep(worker, NoPass(worker))
            start = time.perf_counter()
            lockstep.run([update] * n)
            best["lockstep"] = min(best["lockstep"], time.perf_counter() - start)
            assert lockstep.stacked_batch_gradients == n * calls  # every call went through the handoff
            immediate = Immediate(worker, NoPass(worker))
            start = time.perf_counter()
            for slot in range(n):
                update(LockstepTrainer(worker, immediate, slot))
            best["at_once"] = min(best["at_once"], time.perf_counter() - start)
        lockstep_us, at_once_us = (1e6 * best[k] / (n * calls) for k in ("lockstep", "at_once"))
        rows.append(
            {
                "clients": n,
                "calls": calls,
                "lockstep_us": lockstep_us,
                "at_once_us": at_once_us,
                "handoff_us": lockstep_us - at_once_us,
            }
        )
    return rows


def main(argv: Sequence[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", default=",".join(map(str, CLIENTS)))
    parser.add_argument("--calls", type=int, default=CALLS)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    rows = handoff_costs(bench_worker(), [int(n) for n in args.clients.split(",")], args.calls)
    for r in rows:
        print(
            f"{r['clients']:3d} clients: {r['lockstep_us']:6.1f} us per call in lockstep, {r['at_once_us']:5.1f} "
            f"served at once: handoff {r['handoff_us']:6.1f} us"
        )
    return rows


if __name__ == "__main__":
    main()
