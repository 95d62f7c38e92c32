"""What a method is: a few server hooks and a local update, everything else belongs to the loop.

Server state and per-client state are plain dicts of tensors (so they checkpoint and move between
processes as they are). A method never owns a model: it asks the client context to train from a
vector and reads the trained vector back.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import Tensor

from pfl.client import FitStats, LossFn, Worker
from pfl.flat import FlatModule
from pfl.optim.terms import Term

State = dict[str, Tensor]


@dataclass
class ClientContext:
    """One client as a method sees it during a round: its id, its persistent state, a worker."""

    cid: int
    round: int
    worker: Worker
    state: State
    init_state: Tensor
    fits: list[FitStats] = field(default_factory=list)

    def fit(
        self,
        start: Tensor,
        *,
        epochs: int | None = None,
        terms: Sequence[Term] = (),
        purpose: str = "train",
        lr: float | None = None,
        keep_momentum: bool = False,
        loss_fn: LossFn | None = None,
    ) -> Tensor:
        """Train from ``start`` on this client's train split; returns the trained state vector.

        ``keep_momentum``: the optimizer's momentum continues from this client's previous fit (kept
        in ``state["momentum"]``, so it checkpoints) instead of starting from zero."""
        buf = self.state.get("momentum") if keep_momentum else None
        stats = self.worker.fit(
            self.cid,
            start,
            self.round,
            epochs=epochs,
            terms=terms,
            purpose=purpose,
            lr=lr,
            momentum_buffer=buf,
            loss_fn=loss_fn,
        )
        if keep_momentum:
            saved = self.worker.momentum_buffer()
            if saved is not None:
                self.state["momentum"] = saved
        self.fits.append(stats)
        return self.worker.snapshot()

    def mean_gradient(self, state: Tensor) -> tuple[Tensor, float]:
        """Mean batch gradient and mean loss over one full pass of the train split at ``state``."""
        return self.worker.mean_gradient(self.cid, state)

    @property
    def flat(self) -> FlatModule:
        return self.worker.flat

    def params(self, state: Tensor) -> Tensor:
        """The trainable-parameter part of a full state vector (what proximal terms act on)."""
        return state[: self.worker.flat.num_params]

    @property
    def num_samples(self) -> int:
        return len(self.worker.split(self.cid).train)


class Method:
    """Base class. Subclasses set ``name``/``description`` and implement the hooks they change."""

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    has_global_model: ClassVar[bool] = True

    # -- server side ----------------------------------------------------------------------------
    def setup(self, worker: Worker, clients_per_round: int) -> None:  # noqa: B027 - optional hook
        """Called once by the loop before ``init_server``: the model layout (``worker.flat``), the
        number of clients and the per-round sample size, for methods whose server state or
        exchanged parts depend on them. Keep what is stored here in ``_private`` attributes."""

    def init_server(self, init_state: Tensor) -> State:
        """The server's state before round 0."""
        return {"global": init_state.clone()}

    def payload(self, server: State, cid: int) -> State:
        """What the server sends to client ``cid`` this round."""
        return {"global": server["global"]}

    def aggregate(self, server: State, results: dict[int, dict[str, Any]]) -> None:
        """Combine the sampled clients' results (keyed by client id) into the server state."""
        ordered = [results[cid] for cid in sorted(results)]
        server["global"] = weighted_mean([r["state"] for r in ordered], [r["weight"] for r in ordered])

    def global_state(self, server: State) -> Tensor | None:
        return server.get("global") if self.has_global_model else None

    # -- client side ----------------------------------------------------------------------------
    def local_update(self, client: ClientContext, payload: State) -> dict[str, Any]:
        """Run on the client; returns what it uploads (tensors and scalars)."""
        raise NotImplementedError

    def personal_state(self, server: State, client: ClientContext) -> Tensor:
        """The client's personalized model used for evaluation."""
        raise NotImplementedError

    def adapt_new_client(self, server: State, client: ClientContext, epochs: int) -> Tensor:
        """The model of a client that never took part (``eval.new_client_epochs`` of fine-tuning):
        the global model trained ``epochs`` on its train split, or the initial model for methods
        without one. Methods with their own adaptation (e.g. FedORA's propagation) override this."""
        start = self.global_state(server)
        start = client.init_state if start is None else start
        if epochs == 0:
            return start
        return client.fit(start, epochs=epochs, purpose="new_client")

    # -- bookkeeping ----------------------------------------------------------------------------
    def hparams(self) -> dict[str, Any]:
        return {k: v for k, v in vars(self).items() if not k.startswith("_")}


def weighted_mean(vectors: Sequence[Tensor], weights: Sequence[float]) -> Tensor:
    """Σ w_i v_i / Σ w_i, summed in the given order (callers pass clients sorted by id, so the result
    does not depend on the order in which clients were trained)."""
    total = float(sum(weights))
    out = torch.zeros_like(vectors[0])
    for v, w in zip(vectors, weights, strict=True):
        out.add_(v, alpha=float(w) / total)
    return out
