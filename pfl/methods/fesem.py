"""FeSEM (Xie et al., "Multi-center federated learning", 2021): stochastic expectation maximisation
over k cluster centres, with clients assigned by the distance between their models and the centres."""

from __future__ import annotations

import torch
from torch import Tensor

from pfl.methods.base import ClientContext, ServerContext, State, Upload, weighted_mean
from pfl.methods.ifca import ClusterModels, lowest_loss_cluster
from pfl.methods.model_rows import cluster_starts
from pfl.methods.registry import register
from pfl.seeding import torch_generator


@register
class FeSEM(ClusterModels):
    """FeSEM: the server keeps k centres c_j and an assignment r_i per client. Each round a sampled
    client receives c_{r_i}, trains it locally for E epochs and uploads θ_i; the server then runs one
    stochastic EM step on the uploads: E-step r_i = argmin_j ‖θ_i − c_j‖² (parameters only), M-step
    c_j = sample-weighted mean of the uploads assigned to j (a centre with no upload this round is
    kept). The P-model of client i is its centre c_{r_i}. Initial assignments are uniform at random
    (keyed by the seed); centre 0 is the shared initialisation, each other one an independent
    initialisation of the network (``model_rows.cluster_starts``), so k = 1 is FedAvg step for step.

    Args:
        clusters: k, the number of centres.
    """

    name = "fesem"
    description = "stochastic EM clustering of client models by parameter distance, one model per cluster"
    averages_uploads = False  # one model per cluster

    def init_server(self, server: ServerContext) -> State:
        gen = torch_generator(server.seed, "fesem", "assign")
        assign = torch.randint(self.clusters, (server.num_clients,), generator=gen).to(server.device)
        centers = cluster_starts(server, self.clusters, "fesem")
        return {"centers": centers, "assign": assign}

    def payload(self, server: ServerContext, cid: int) -> State:
        return {"center": server["centers"][int(server["assign"][cid])]}

    def local_update(self, client: ClientContext, payload: State) -> Upload:
        return Upload(client.fit(payload["center"]), client.num_samples)

    def aggregate(self, server: ServerContext, uploads: dict[int, Upload]) -> None:
        cids = sorted(uploads)
        centers, p = server["centers"], server.layout.num_params
        for cid in cids:  # E-step on the uploaded models
            dist = (uploads[cid].state[:p] - centers[:, :p]).pow(2).sum(dim=1)
            server["assign"][cid] = int(torch.argmin(dist))
        for j in range(self.clusters):  # M-step
            members = [uploads[c] for c in cids if int(server["assign"][c]) == j]
            if members:
                centers[j] = weighted_mean([u.state for u in members], [u.weight for u in members])

    def personal_state(self, server: ServerContext, client: ClientContext) -> Tensor:
        return server["centers"][int(server["assign"][client.cid])]

    def adapt_new_client(self, server: ServerContext, client: ClientContext, epochs: int) -> Tensor:
        """A held-out client has no model to compare with the centres: it takes the centre with the
        lowest loss on its train split, then fine-tunes it ``epochs`` epochs."""
        start = server["centers"][lowest_loss_cluster(client, server["centers"])]
        return start if epochs == 0 else client.fit(start, epochs=epochs, purpose="new_client")
