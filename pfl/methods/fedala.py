"""FedALA (Zhang et al., AAAI 2023): adaptive local aggregation of the downloaded global model.

Before training, client i mixes the global model g into its last local model θ element-wise on the
top ``layer_idx`` layers (all layers below take g):

    θ̂ = g + (θ − g) ⊙ (1 − W),   W ∈ [0, 1]^|top|      (= θ + (g − θ) ⊙ W, written so W = 1 gives g exactly)

and learns W on a random ``rand_percent`` % of its training batches, per batch

    W ← clip(W − η · ∇_θ̂ f_i(θ̂; B) ⊙ (g − θ), 0, 1),   then θ̂ is recomputed from W.

W starts at 1 and is kept by the client across rounds. The first time (the "start phase") W is
trained for whole passes until the standard deviation of the last ``num_pre_loss`` pass losses falls
below ``threshold`` (at most ``max_start_epochs`` passes, pfl's guard against a threshold that is
never met); afterwards one pass per round. The client then trains θ̂ for ``client.epochs`` as
FedAvg does and uploads it; the server averages with data-size weights. The P-model is the
client's last trained model.

Where pfl states the official code's choices: ``layer_idx`` counts pfl layers (a layer's weight and
bias together; the code counts parameter tensors, so its ``-p 2`` is ``layer_idx: 1`` here), and
``layer_idx: 0`` means every layer, as in the code. The pass loss is that of the pass's last batch.
At its first participation a client starts from g (the code skips ALA while the local model equals
the global one). BatchNorm buffers come from g.
"""

from __future__ import annotations

import torch
from torch import Tensor

from pfl.errors import require
from pfl.methods.base import ClientContext, ServerContext, State, Upload
from pfl.methods.fedavg import FedAvg
from pfl.methods.registry import register


@register
class FedALA(FedAvg):
    """FedALA; the module docstring states the update."""

    name = "fedala"
    description = "element-wise learned mix of the global model into the local one on the top layers, then FedAvg"
    has_personal_model = True

    def __init__(
        self,
        eta: float = 1.0,
        rand_percent: float = 80.0,
        layer_idx: int = 1,
        threshold: float = 0.01,
        num_pre_loss: int = 10,
        max_start_epochs: int = 100,
    ):
        super().__init__(finetune_epochs=0)
        require(eta >= 0, "method.eta", f"the weight learning rate must be >= 0 (got {eta})")
        require(0 < rand_percent <= 100, "method.rand_percent", f"must be in (0, 100] (got {rand_percent})")
        require(layer_idx >= 0, "method.layer_idx", f"must be >= 0 (got {layer_idx})", "0 means every layer")
        require(threshold >= 0, "method.threshold", f"must be >= 0 (got {threshold})")
        require(num_pre_loss >= 1, "method.num_pre_loss", f"must be >= 1 (got {num_pre_loss})")
        require(max_start_epochs >= 1, "method.max_start_epochs", f"must be >= 1 (got {max_start_epochs})")
        self.eta, self.rand_percent, self.layer_idx = eta, rand_percent, layer_idx
        self.threshold, self.num_pre_loss, self.max_start_epochs = threshold, num_pre_loss, max_start_epochs

    def init_server(self, server: ServerContext) -> State:
        require(
            self.layer_idx <= server.layout.num_layers,
            "method.layer_idx",
            f"the model has {server.layout.num_layers} layers (got {self.layer_idx})",
        )
        return super().init_server(server)

    def top(self, client: ClientContext) -> slice:
        """The parameters ALA mixes: the last ``layer_idx`` layers (all of them for 0)."""
        layout = client.layout
        return slice(0, layout.num_params) if self.layer_idx == 0 else layout.tail(self.layer_idx)

    def local_update(self, client: ClientContext, payload: State) -> Upload:
        g = payload["global"]
        own = client.state.get("personal")
        start = g if own is None else self.adaptive_local_aggregation(client, g, own)
        trained = client.fit(start)
        client.state["personal"] = trained
        return Upload(trained, client.num_samples)

    def adaptive_local_aggregation(self, client: ClientContext, g: Tensor, own: Tensor) -> Tensor:
        """θ̂ from the global model ``g`` and the client's model ``own``; learns and keeps W."""
        sl = self.top(client)
        away = own[sl] - g[sl]  # θ − g
        weights = client.state.get("ala_weights", torch.ones_like(away)).clone()
        start = g.clone()
        if self.eta == 0:  # nothing to learn: W stays where it is
            start[sl] += away * (1 - weights)
            return start
        flat = client.flat
        flat.load(start)
        params, grads = flat.params, flat.grads
        with torch.no_grad():
            params[sl] += away * (1 - weights)
        n, bs = client.num_samples, client.batch_size
        per_pass = client.batches_per_epoch
        used = max(1, int(self.rand_percent / 100 * (n // bs)))  # s% of the whole batches (the code: a partial one too)
        start_phase = "ala_weights" not in client.state
        passes = self.max_start_epochs if start_phase else 1
        batches = client.batches("ala", epochs=passes)
        losses: list[float] = []
        for _ in range(passes):
            for j in range(per_pass):
                b = next(batches)
                if j >= used:
                    continue
                loss = client.gradient(b)
                with torch.no_grad():
                    # ∂θ̂/∂W = g − θ = −away
                    weights.add_(self.eta * grads[sl] * away).clamp_(0.0, 1.0)
                    params[sl] = g[sl] + away * (1 - weights)
            losses.append(float(loss))
            window = torch.tensor(losses[-self.num_pre_loss :])
            if start_phase and len(losses) > self.num_pre_loss and float(window.std(unbiased=False)) < self.threshold:
                break
        client.state["ala_weights"] = weights
        start = flat.snapshot()
        start[client.layout.num_params :] = g[client.layout.num_params :]  # buffers from g, not from ALA passes
        return start

    def personal_state(self, server: ServerContext, client: ClientContext) -> Tensor:
        return client.state.get("personal", client.init_state)
