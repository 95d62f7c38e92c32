"""IFCA (Ghosh et al., NeurIPS'20): k cluster models; each client joins the cluster whose model has the
lowest loss on its training data, trains that model, and the server averages each cluster's uploads."""

from __future__ import annotations

import torch
from torch import Tensor

from pfl.errors import require
from pfl.methods.base import ClientContext, Method, ServerContext, State, Upload, weighted_mean
from pfl.methods.model_rows import cluster_starts
from pfl.methods.registry import register


def lowest_loss_cluster(client: ClientContext, models: Tensor) -> int:
    """argmin_j of the mean training loss of cluster model j on the client (ties: the lowest j)."""
    if len(models) == 1:
        return 0
    losses = [client.evaluate(m, client.train_idx).loss for m in models]
    return min(range(len(losses)), key=losses.__getitem__)


class ClusterModels(Method):
    """k models, one per cluster of clients (IFCA, FeSEM), and no global model."""

    has_global_model = False

    def __init__(self, clusters: int = 4):
        require(clusters >= 1, "method.clusters", f"must be >= 1 (got {clusters})")
        self.clusters = clusters


@register
class IFCA(ClusterModels):
    """IFCA, model-averaging variant: the server sends all k cluster models; client i picks
    j = argmin_j L_i(θ_j) on its train split, trains θ_j for E epochs and uploads it with j; cluster j
    becomes the sample-weighted mean of its uploads (a cluster nobody picked keeps its model). The
    P-model of a client is the cluster model it picks with the current models. Cluster 0 starts from
    the shared initialisation and each other one from an independent initialisation of the network
    (``model_rows.cluster_starts``), so k = 1 is FedAvg step for step.

    Args:
        clusters: k, the number of cluster models.
    """

    name = "ifca"
    description = "k cluster models, each client trains the one with the lowest loss on its data"
    averages_uploads = False  # one model per cluster

    def init_server(self, server: ServerContext) -> State:
        return {"models": cluster_starts(server, self.clusters, "ifca")}

    def payload(self, server: ServerContext, cid: int) -> State:
        return {"models": server["models"]}

    def local_update(self, client: ClientContext, payload: State) -> Upload:
        j = lowest_loss_cluster(client, payload["models"])
        trained = client.fit(payload["models"][j])
        return Upload(trained, client.num_samples, {"cluster": torch.tensor(j, device=trained.device)})

    def aggregate(self, server: ServerContext, uploads: dict[int, Upload]) -> None:
        for j in range(self.clusters):
            members = [uploads[c] for c in sorted(uploads) if int(uploads[c]["cluster"]) == j]
            if members:
                server["models"][j] = weighted_mean([u.state for u in members], [u.weight for u in members])

    def personal_state(self, server: ServerContext, client: ClientContext) -> Tensor:
        return server["models"][lowest_loss_cluster(client, server["models"])]

    def adapt_new_client(self, server: ServerContext, client: ClientContext, epochs: int) -> Tensor:
        """A held-out client picks its cluster the same way, then fine-tunes it ``epochs`` epochs."""
        start = server["models"][lowest_loss_cluster(client, server["models"])]
        return start if epochs == 0 else client.fit(start, epochs=epochs, purpose="new_client")
