from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from pfl.client import Worker
from pfl.errors import require
from pfl.methods.base import ClientContext, Method, State


class FedFomo(Method):
    """FedFomo (Zhang et al. 2021). The server keeps last round's uploaded models and an affinity
    matrix P; client i downloads the ``num_models`` models j with the largest P_ij, weighs each by
    w_j = max(0, L_i(θ_i) − L_i(θ_j)) / ‖θ_j − θ_i‖ on a validation part of its data, moves to
    θ_i + Σ_j (w_j / Σw)(θ_j − θ_i) (keeps θ_i when all w_j = 0), trains locally and uploads θ_i and
    w (the server adds w to P_i·). The validation part is the first ``val_frac`` of the client's
    train split (the client's val split when it has one); it is not held out of training."""

    name = "fedfomo"
    description = "first-order model optimization: personalized weighted download of other clients' models"
    has_global_model = False

    def __init__(self, num_models: int = 8, val_frac: float = 0.2):
        require(num_models >= 0, "method.num_models", f"must be >= 0 (got {num_models})")
        require(0 < val_frac <= 1, "method.val_frac", f"must be in (0, 1] (got {val_frac})")
        self.num_models, self.val_frac = num_models, val_frac
        self._num_clients = 0

    def setup(self, worker: Worker, clients_per_round: int) -> None:
        self._num_clients = worker.data.num_clients

    def init_server(self, init_state: Tensor) -> State:
        n = self._num_clients
        return {"P": torch.zeros(n, n, device=init_state.device)}

    def payload(self, server: State, cid: int) -> State:
        if "prev_ids" not in server or self.num_models == 0:
            return {}
        ids = server["prev_ids"]
        keep = (ids != cid).nonzero().flatten()
        if len(keep) == 0:
            return {}
        order = torch.argsort(server["P"][cid, ids[keep]], descending=True, stable=True)
        chosen = keep[order[: self.num_models]]
        return {"models": server["prev_models"][chosen], "ids": ids[chosen]}

    def _val(self, client: ClientContext) -> Tensor:
        split = client.worker.data.clients[client.cid]
        if len(split.val):
            return split.val
        return split.train[: max(1, int(round(self.val_frac * len(split.train))))]

    def local_update(self, client: ClientContext, payload: State) -> dict[str, Any]:
        own = self.personal_state({}, client)
        out: dict[str, Any] = {"weight": client.num_samples}
        start = own
        if "models" in payload:
            val, worker, p = self._val(client), client.worker, client.flat.num_params
            own_loss = worker.evaluate(own, val).loss
            weights = []
            for m in payload["models"]:
                dist = float((m[:p] - own[:p]).norm())
                gain = own_loss - worker.evaluate(m, val).loss
                weights.append(max(0.0, gain) / max(dist, 1e-12))
            w = torch.tensor(weights, device=own.device)
            if float(w.sum()) > 0:
                start = own + ((w / w.sum())[:, None] * (payload["models"] - own)).sum(0)
            out["ids"], out["fomo"] = payload["ids"], w
        trained = client.fit(start)
        client.state["personal"] = trained
        out["state"] = trained
        return out

    def aggregate(self, server: State, results: dict[int, dict[str, Any]]) -> None:
        cids = sorted(results)
        for cid in cids:
            r = results[cid]
            if "fomo" in r:
                server["P"][cid, r["ids"]] += r["fomo"]
        server["prev_models"] = torch.stack([results[c]["state"] for c in cids])
        server["prev_ids"] = torch.tensor(cids, dtype=torch.long, device=server["prev_models"].device)

    def personal_state(self, server: State, client: ClientContext) -> Tensor:
        return client.state.get("personal", client.init_state)
