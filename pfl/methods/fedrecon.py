"""FedRecon (Singhal et al., NeurIPS 2021): federated reconstruction, partially local learning.

The model splits into global parameters g (shared, averaged by the server) and local parameters l
(the last ``local_layers`` layers, never sent). Client i in a round:

    reconstruct  l_i = ``recon_epochs`` epochs of SGD on f_i(g, l) over l only (g frozen), from the
                 initial l (stateless clients: nothing of l survives the round)
    update       g_i = ``client.epochs`` epochs of SGD on f_i(g, l_i) over g only (l_i frozen)
    upload       g_i; the server averages with data-size weights (``server.*`` adds a server optimizer
                 only for methods with a whole global model, so FedRecon's server step is the average).

Evaluation is "reconstruct, then evaluate": a client's P-model is (g, l_i) with l_i reconstructed
from the initial l on its train split at the current g; a client never seen in training
(``data.new_clients``) is evaluated the same way. ``local_layers: 0`` is FedAvg.

Options: ``recon_lr`` (null: client.lr); ``reset_local: false`` keeps l_i between rounds and
reconstructs from it (PAGE's baseline code keeps each client's head); ``support_query: true`` splits
each client's train split into a support set (its samples at even positions), on which l is
reconstructed, in training and in evaluation alike, and a disjoint query set (odd positions), on which
g is updated: the paper's Algorithm 1 and the authors' experiment commands (the default); false uses the
whole train split for both phases (their library's default). A client with fewer than 2 train samples
cannot be split and uses its whole split for both.
"""

from __future__ import annotations

from torch import Tensor

from pfl.engine.flat import ModelLayout
from pfl.engine.terms import Freeze
from pfl.errors import require
from pfl.methods.base import ClientContext, ServerContext, State, Upload
from pfl.methods.layer_sharing import LayerSharing
from pfl.methods.registry import register


@register
class FedRecon(LayerSharing):
    """FedRecon; the module docstring states the round.

    Args:
        local_layers: the last layers that stay on the client and are reconstructed (0: FedAvg).
        recon_epochs: epochs of reconstruction (global layers frozen) before the global update.
        recon_lr: learning rate of reconstruction (null: client.lr).
        reset_local: reconstruct from the initial local layers each round (false: from the client's last ones).
        support_query: reconstruct on the train split's even-position samples and update the global layers
            on the odd ones (the paper's split, the default); false uses the whole train split for both.
    """

    name = "fedrecon"
    description = "local layers reconstructed from scratch each round with the global part frozen, then global training"

    def __init__(
        self,
        local_layers: int = 1,
        recon_epochs: int = 1,
        recon_lr: float | None = None,
        reset_local: bool = True,
        support_query: bool = True,
    ):
        require(local_layers >= 0, "method.local_layers", f"must be >= 0 (got {local_layers})")
        require(recon_epochs >= 1, "method.recon_epochs", f"must be >= 1 (got {recon_epochs})")
        require(recon_lr is None or recon_lr > 0, "method.recon_lr", "must be > 0, or null for client.lr")
        self.local_layers, self.recon_epochs, self.recon_lr = local_layers, recon_epochs, recon_lr
        self.reset_local, self.support_query = reset_local, support_query

    def shared_mask(self, layout: ModelLayout) -> Tensor:
        self.check_layers("local_layers", self.local_layers, layout)
        return ~layout.state_mask(layout.tail(self.local_layers))

    def phases(self, client: ClientContext) -> tuple[Tensor | None, Tensor | None]:
        """The samples (pool indices) reconstruction and the global update train on: (support, query);
        None is the whole train split."""
        train = client.train_idx
        if not self.support_query or len(train) < 2:
            return None, None
        return train[0::2], train[1::2]

    def reconstruct(self, client: ClientContext, start: Tensor, purpose: str) -> Tensor:
        """``start`` with its local layers retrained for ``recon_epochs`` on the support samples and
        everything else frozen."""
        if self.local_layers == 0:
            return start
        local = client.layout.tail(self.local_layers)
        frozen = Freeze(client.params(start), slice(0, local.start))
        support = self.phases(client)[0]
        return client.fit(
            start, epochs=self.recon_epochs, lr=self.recon_lr, terms=[frozen], purpose=purpose, indices=support
        )

    def base(self, client: ClientContext) -> Tensor:
        """Where the local layers start from: the initial model, or the client's last ones."""
        return client.init_state if self.reset_local else self.own(client)

    def local_update(self, client: ClientContext, payload: State) -> Upload:
        start = self.compose(payload["shared"], self.base(client), client.layout)
        if self.local_layers == 0:
            trained = client.fit(start)
        else:
            rebuilt = self.reconstruct(client, start, "reconstruct")
            local = client.layout.tail(self.local_layers)
            query = self.phases(client)[1]
            trained = client.fit(rebuilt, terms=[Freeze(client.params(rebuilt), local)], indices=query)
        if not self.reset_local:
            client.state["personal"] = trained
        return Upload(trained[self.mask(client.layout)], client.num_samples)

    def personal_state(self, server: ServerContext, client: ClientContext) -> Tensor:
        start = self.compose(server["global"][self.mask(server.layout)], self.base(client), server.layout)
        return self.reconstruct(client, start, "eval_reconstruct")

    def adapt_new_client(self, server: ServerContext, client: ClientContext, epochs: int) -> Tensor:
        """Reconstruct, then evaluate (``eval.new_client_epochs`` is not used: a new client
        reconstructs exactly as a training client does)."""
        start = self.compose(server["global"][self.mask(server.layout)], client.init_state, server.layout)
        return self.reconstruct(client, start, "new_client")
