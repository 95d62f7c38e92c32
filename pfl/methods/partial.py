"""Methods that share only part of the model: FedPer, LG-FedAvg, FedRep, FedBABU.

The state vector splits by layer into a shared part (averaged by the server, the only part that is
sent either way) and a personal part that each client keeps. "Layers" are the model's parametrised
modules in order (``FlatModule.layer_slices``); the classifier head is the last one.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from pfl.client import Worker
from pfl.errors import require
from pfl.flat import FlatModule
from pfl.methods.base import ClientContext, Method, State, weighted_mean
from pfl.optim.terms import Freeze


class PartialSharing(Method):
    """Base: ``shared_mask`` says which entries of the state vector are global."""

    has_global_model = False  # the shared part alone is no model

    def setup(self, worker: Worker, clients_per_round: int) -> None:
        self._flat = worker.flat
        self._mask = self.shared_mask(worker.flat)

    def shared_mask(self, flat: FlatModule) -> Tensor:
        raise NotImplementedError

    def _check_layers(self, field: str, k: int, flat: FlatModule) -> None:
        require(
            0 <= k <= flat.num_layers,
            f"method.{field}",
            f"must be in [0, {flat.num_layers}] for this model (got {k})",
            "the model's layers are its parametrised modules; the head is the last one",
        )

    def compose(self, shared: Tensor, base: Tensor) -> Tensor:
        """A full state: ``shared`` on the shared entries, ``base`` elsewhere."""
        out = base.clone()
        out[self._mask] = shared
        return out

    def payload(self, server: State, cid: int) -> State:
        return {"shared": server["global"][self._mask]}

    def aggregate(self, server: State, results: dict[int, dict[str, Any]]) -> None:
        ordered = [results[cid] for cid in sorted(results)]
        server["global"][self._mask] = weighted_mean([r["shared"] for r in ordered], [r["weight"] for r in ordered])

    def own(self, client: ClientContext) -> Tensor:
        """The client's last full state (its personal part is what matters)."""
        return client.state.get("personal", client.init_state)

    def train(self, client: ClientContext, start: Tensor) -> Tensor:
        return client.fit(start)

    def local_update(self, client: ClientContext, payload: State) -> dict[str, Any]:
        trained = self.train(client, self.compose(payload["shared"], self.own(client)))
        client.state["personal"] = trained
        return {"shared": trained[self._mask], "weight": client.num_samples}

    def personal_state(self, server: State, client: ClientContext) -> Tensor:
        return self.compose(server["global"][self._mask], self.own(client))


class FedPer(PartialSharing):
    """FedPer (Arivazhagan et al. 2019): shared body, the last ``personal_layers`` layers stay local."""

    name = "fedper"
    description = "shared body averaged by the server; the last personal_layers layers stay on the client"

    def __init__(self, personal_layers: int = 1):
        require(personal_layers >= 0, "method.personal_layers", f"must be >= 0 (got {personal_layers})")
        self.personal_layers = personal_layers

    def shared_mask(self, flat: FlatModule) -> Tensor:
        self._check_layers("personal_layers", self.personal_layers, flat)
        return ~flat.state_mask(flat.tail_slice(self.personal_layers))


class LGFedAvg(PartialSharing):
    """LG-FedAvg (Liang et al. 2020): local representation, the last ``global_layers`` layers shared."""

    name = "lgfedavg"
    description = "local representation layers; only the last global_layers layers are averaged"

    def __init__(self, global_layers: int = 1):
        require(global_layers >= 0, "method.global_layers", f"must be >= 0 (got {global_layers})")
        self.global_layers = global_layers

    def shared_mask(self, flat: FlatModule) -> Tensor:
        self._check_layers("global_layers", self.global_layers, flat)
        mask = flat.state_mask(flat.tail_slice(self.global_layers))
        if self.global_layers == flat.num_layers:
            mask[flat.num_params :] = True  # the whole model is global: buffers too
        return mask


class FedRep(FedPer):
    """FedRep (Collins et al. 2021): ``head_epochs`` epochs on the personal head with the body frozen,
    then ``client.epochs`` on the shared body with the head frozen."""

    name = "fedrep"
    description = "head epochs with the body frozen, then body epochs with the head frozen; bodies averaged"

    def __init__(self, personal_layers: int = 1, head_epochs: int = 1):
        super().__init__(personal_layers)
        require(head_epochs >= 0, "method.head_epochs", f"must be >= 0 (got {head_epochs})")
        self.head_epochs = head_epochs

    def train(self, client: ClientContext, start: Tensor) -> Tensor:
        head = self._flat.tail_slice(self.personal_layers)
        body = slice(0, head.start)
        state = start
        if self.head_epochs > 0:
            frozen = Freeze(client.params(state), body)
            state = client.fit(state, epochs=self.head_epochs, terms=[frozen], purpose="head")
        return client.fit(state, terms=[Freeze(client.params(state), head)])


class FedBABU(PartialSharing):
    """FedBABU (Oh et al. 2022): the body is trained and averaged while the head stays at its random
    initialisation everywhere; a client's P-model is the global model fine-tuned ``finetune_epochs``
    (all layers) at ``finetune_lr`` (the authors' code: 0.001; null = client.lr)."""

    name = "fedbabu"
    description = "body-only federated training with the head frozen at init; P-model = fine-tuned global"
    has_global_model = True  # global body + the initial head

    def __init__(self, head_layers: int = 1, finetune_epochs: int = 1, finetune_lr: float | None = 0.001):
        require(head_layers >= 0, "method.head_layers", f"must be >= 0 (got {head_layers})")
        require(finetune_epochs >= 0, "method.finetune_epochs", f"must be >= 0 (got {finetune_epochs})")
        require(finetune_lr is None or finetune_lr > 0, "method.finetune_lr", "must be > 0, or null for client.lr")
        self.head_layers, self.finetune_epochs, self.finetune_lr = head_layers, finetune_epochs, finetune_lr

    def shared_mask(self, flat: FlatModule) -> Tensor:
        self._check_layers("head_layers", self.head_layers, flat)
        return ~flat.state_mask(flat.tail_slice(self.head_layers))

    def own(self, client: ClientContext) -> Tensor:
        return client.init_state  # the head is the common initial one, never personal

    def local_update(self, client: ClientContext, payload: State) -> dict[str, Any]:
        start = self.compose(payload["shared"], client.init_state)
        frozen = Freeze(client.params(start), self._flat.tail_slice(self.head_layers))
        trained = client.fit(start, terms=[frozen])
        return {"shared": trained[self._mask], "weight": client.num_samples}

    def personal_state(self, server: State, client: ClientContext) -> Tensor:
        start = self.compose(server["global"][self._mask], client.init_state)
        if self.finetune_epochs == 0:
            return start
        return client.fit(start, epochs=self.finetune_epochs, purpose="finetune", lr=self.finetune_lr)


__all__ = ["FedBABU", "FedPer", "FedRep", "LGFedAvg", "PartialSharing"]
