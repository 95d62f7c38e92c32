"""FedFomo (Zhang et al., ICLR 2021): first-order model optimization over other clients' models.

Client i holds out a validation part V_i of its data. Each round it downloads models θ_j of last
round's clients, weighs each by w_j = max(0, L_i(θ_i) − L_i(θ_j)) / ‖θ_j − θ_i‖ (losses on V_i), moves
to θ_i + Σ_j (w_j / Σw)(θ_j − θ_i) (keeps θ_i when every w_j = 0) and trains on the rest of its data.
The server keeps an affinity matrix P (P_ij += w_j) and sends client i the models with the largest
P_ij, exploring ε-greedily. Options for the FedFomo authors' code: ``affinity: signed`` adds the unclipped
(L_i(θ_i) − L_i(θ_j)) / ‖θ_j − θ_i‖ to P (a worse model lowers its affinity), ``normalize_affinity``
divides what is added by |Σ_j| of it, and ``distance: l1`` measures ‖θ_j − θ_i‖ in ℓ1.
"""

from __future__ import annotations

from typing import Any, Literal, TypeAlias

import torch
from torch import Tensor

from pfl.errors import require
from pfl.methods.base import ClientContext, ClientOptimizerMethod, ServerContext, State, Upload
from pfl.methods.registry import register
from pfl.seeding import torch_generator

Affinity: TypeAlias = Literal["clipped", "signed"]
Distance: TypeAlias = Literal["l2", "l1"]


def affinity_deltas(own_loss: float, losses: list[float], distances: list[float]) -> Tensor:
    """(L_i(θ_i) − L_i(θ_j)) / ‖θ_j − θ_i‖, signed (a zero distance counts as 1e-12); FedFomo's weight
    w_j is its positive part."""
    return torch.tensor([(own_loss - lj) / max(dj, 1e-12) for lj, dj in zip(losses, distances, strict=True)])


def parameter_distance(a: Tensor, b: Tensor, distance: Distance) -> float:
    """‖a − b‖ in ℓ2 or ℓ1."""
    return float((a - b).norm(p=2 if distance == "l2" else 1))


def select_models(
    affinity: Tensor, candidates: Tensor, count: int, epsilon: float, generator: torch.Generator
) -> Tensor:
    """``count`` of the ``candidates`` (client ids) for one client: slot by slot, with probability
    ``epsilon`` the next not yet chosen id of a random permutation, otherwise the next not yet chosen
    id by descending ``affinity`` (one value per candidate); ties in affinity are broken at random."""
    n = len(candidates)
    tie = torch.rand(n, generator=generator)
    by_tie = torch.argsort(tie)
    ranked = by_tie[torch.argsort(affinity.cpu()[by_tie], descending=True, stable=True)].tolist()
    shuffled = torch.randperm(n, generator=generator).tolist()
    chosen: list[int] = []
    for _ in range(min(count, n)):
        explore = float(torch.rand(1, generator=generator)) < epsilon
        source = shuffled if explore else ranked
        while source[0] in chosen:
            source.pop(0)
        chosen.append(source.pop(0))
    return candidates[torch.tensor(chosen, dtype=torch.long, device=candidates.device)]


@register
class FedFomo(ClientOptimizerMethod):
    """FedFomo. The validation part V_i is the client's val split when it has one (``data.val_frac``;
    then every train sample is trained on), else a fixed random ``val_frac`` of its train split that
    is held out of training (the authors' code and the PGFed authors' code both hold out 20%).

    Downloads: the ``num_models`` models of last round's clients with the largest P_ij, each slot
    explored with probability ε_t = max(0, ``epsilon`` − t·``epsilon_decay``) (t = round; the FedFomo
    code's ε-greedy selection: 0.3, decaying by 0.05 per round); ties in P are broken at random, keyed
    by (seed, round, client). ``epsilon: 0`` is pure top-P (the PGFed authors' code).
    ``normalize_affinity``: add w / Σw to P instead of w (the PGFed authors' code).

    Args:
        num_models: M, models downloaded per round.
        val_frac: share of the train split held out as V_i when the client has no val split.
        epsilon: initial exploration probability of each download slot.
        epsilon_decay: subtracted from epsilon every round.
        normalize_affinity: add to P what the client uploads divided by |its sum| (the PGFed and FedFomo
            authors' code) instead of as it is.
        affinity: what P adds: clipped (w_j ≥ 0, P never decreases) or signed (the FedFomo authors' code).
        distance: the norm of θ_j − θ_i in w_j: l2, or l1 (the FedFomo authors' code's default).
    """

    name = "fedfomo"
    description = "first-order model optimization: personalized weighted download of other clients' models"
    has_global_model = False
    averages_uploads = False  # each client weighs the models it downloaded

    def __init__(
        self,
        num_models: int = 8,
        val_frac: float = 0.2,
        epsilon: float = 0.3,
        epsilon_decay: float = 0.05,
        normalize_affinity: bool = False,
        affinity: Affinity = "clipped",
        distance: Distance = "l2",
        **kwargs: Any,
    ):
        require(num_models >= 0, "method.num_models", f"must be >= 0 (got {num_models})")
        require(0 < val_frac < 1, "method.val_frac", f"must be in (0, 1): a part is held out (got {val_frac})")
        require(0 <= epsilon <= 1, "method.epsilon", f"an exploration probability must be in [0, 1] (got {epsilon})")
        require(epsilon_decay >= 0, "method.epsilon_decay", f"must be >= 0 (got {epsilon_decay})")
        self.num_models, self.val_frac = num_models, val_frac
        self.epsilon, self.epsilon_decay, self.normalize_affinity = epsilon, epsilon_decay, normalize_affinity
        self.affinity, self.distance = affinity, distance
        super().__init__(**kwargs)

    # -- server ---------------------------------------------------------------------------------
    def init_server(self, server: ServerContext) -> State:
        n = server.num_clients
        return {"P": torch.zeros(n, n, device=server.device)}

    def exploration(self, round_idx: int) -> float:
        """ε_t = max(0, ε − t·decay)."""
        return max(0.0, self.epsilon - round_idx * self.epsilon_decay)

    def payload(self, server: ServerContext, cid: int) -> State:
        if "prev_ids" not in server or self.num_models == 0:
            return {}
        ids = server["prev_ids"]
        keep = (ids != cid).nonzero().flatten()
        if len(keep) == 0:
            return {}
        gen = torch_generator(server.seed, server.round, cid, "fomo")
        eps = self.exploration(server.round)
        chosen = select_models(server["P"][cid, ids[keep]], keep, self.num_models, eps, gen)
        return {"models": server["prev_models"][chosen], "ids": ids[chosen]}

    def aggregate(self, server: ServerContext, uploads: dict[int, Upload]) -> None:
        cids = sorted(uploads)
        for cid in cids:
            r = uploads[cid]
            if "fomo" in r:
                w = r["fomo"]
                if self.normalize_affinity and float(w.sum().abs()) > 0:
                    w = w / w.sum().abs()
                server["P"][cid, r["ids"]] += w
        server["prev_models"] = torch.stack([uploads[c].state for c in cids])
        server["prev_ids"] = torch.tensor(cids, dtype=torch.long, device=server["prev_models"].device)

    # -- client ---------------------------------------------------------------------------------
    def split(self, client: ClientContext) -> tuple[Tensor, Tensor | None]:
        """(V_i, the samples trained on; None = the whole train split)."""
        if len(client.val_idx):
            return client.val_idx, None
        train = client.train_idx
        k = min(len(train) - 1, max(1, int(round(self.val_frac * len(train)))))
        gen = torch_generator(client.seed, "fomo", "val", client.cid)  # the same part every round
        perm = torch.randperm(len(train), generator=gen).to(train.device)
        held = torch.zeros(len(train), dtype=torch.bool, device=train.device)
        held[perm[:k]] = True
        return train[held], train[~held]

    def local_update(self, client: ClientContext, payload: State) -> Upload:
        own = client.state.get("personal", client.init_state)
        val, rest = self.split(client)
        extras: dict[str, Any] = {}
        start = own
        if "models" in payload:
            p = client.layout.num_params
            models = payload["models"]
            losses = [client.evaluate(m, val).loss for m in models]
            distances = [parameter_distance(m[:p], own[:p], self.distance) for m in models]
            deltas = affinity_deltas(client.evaluate(own, val).loss, losses, distances).to(own.device)
            w = deltas.clamp_min(0.0)
            if float(w.sum()) > 0:
                start = own + ((w / w.sum())[:, None] * (models - own)).sum(0)
            extras["ids"], extras["fomo"] = payload["ids"], deltas if self.affinity == "signed" else w
        trained = client.fit(start, indices=rest)
        client.state["personal"] = trained
        return Upload(trained, client.num_samples, extras)
