"""The base of methods that share only some layers (FedPer, LG-FedAvg, FedRep, FedBABU).

The state vector splits by layer into a shared part (averaged by the server, the only part that is
sent either way) and a personal part that each client keeps. "Layers" are the model's parametrised
modules in order (``ModelLayout.layers``); the classifier head is the last one.

Float buffers (BatchNorm running statistics) follow the representation: FedPer, FedRep and FedBABU
share the body, so they share the buffers; LG-FedAvg keeps its representation local, so it keeps
the buffers local unless every layer is global. ``share_buffers: false`` keeps them local in every
case (FedBN-style local statistics).

A new client (``eval.new_client_epochs``) starts from the server's shared part and the initial
personal part, then fine-tunes (``adapt``).
"""

from __future__ import annotations

from torch import Tensor

from pfl.engine.flat import ModelLayout
from pfl.errors import require
from pfl.methods.base import ClientContext, Method, ServerContext, State, Upload, weighted_mean_of


class LayerSharing(Method):
    """Base: ``shared_mask(layout)`` says which entries of the state vector are shared."""

    has_global_model = False  # the shared part alone is no model
    averages_uploads = True  # of the shared part
    share_buffers: bool = True
    _mask_cache: tuple[ModelLayout, Tensor] | None = None

    def shared_mask(self, layout: ModelLayout) -> Tensor:
        raise NotImplementedError

    def mask(self, layout: ModelLayout) -> Tensor:
        """``shared_mask`` computed once per model layout (without the buffers unless ``share_buffers``)."""
        if self._mask_cache is None or self._mask_cache[0] is not layout:
            mask = self.shared_mask(layout).clone()
            if not self.share_buffers:
                mask[layout.num_params :] = False
            self._mask_cache = (layout, mask)
        return self._mask_cache[1]

    @staticmethod
    def check_layers(field: str, k: int, layout: ModelLayout) -> None:
        require(
            0 <= k <= layout.num_layers,
            f"method.{field}",
            f"must be in [0, {layout.num_layers}] for this model (got {k})",
            "the model's layers are its parametrised modules; the head is the last one",
        )

    def init_server(self, server: ServerContext) -> State:
        self.mask(server.layout)  # a bad layer count fails here, before any training
        return super().init_server(server)

    def compose(self, shared: Tensor, base: Tensor, layout: ModelLayout) -> Tensor:
        """A full state: ``shared`` on the shared entries, ``base`` elsewhere."""
        out = base.clone()
        out[self.mask(layout)] = shared
        return out

    def payload(self, server: ServerContext, cid: int) -> State:
        return {"shared": server["global"][self.mask(server.layout)]}

    def aggregate(self, server: ServerContext, uploads: dict[int, Upload]) -> None:
        server["global"][self.mask(server.layout)] = weighted_mean_of(uploads)

    def upload_reference(self, server: ServerContext) -> Tensor:
        return server["global"][self.mask(server.layout)]

    def own(self, client: ClientContext) -> Tensor:
        """The client's last full state (its personal part is what matters)."""
        return client.state.get("personal", client.init_state)

    def train(self, client: ClientContext, start: Tensor) -> Tensor:
        return client.fit(start)

    def local_update(self, client: ClientContext, payload: State) -> Upload:
        trained = self.train(client, self.compose(payload["shared"], self.own(client), client.layout))
        client.state["personal"] = trained
        return Upload(trained[self.mask(client.layout)], client.num_samples)

    def personal_state(self, server: ServerContext, client: ClientContext) -> Tensor:
        return self.compose(server["global"][self.mask(server.layout)], self.own(client), server.layout)

    def adapt_new_client(self, server: ServerContext, client: ClientContext, epochs: int) -> Tensor:
        """The server's shared part with the initial personal part, then ``adapt`` for ``epochs``."""
        start = self.compose(server["global"][self.mask(server.layout)], client.init_state, server.layout)
        if epochs == 0:
            return start
        return self.adapt(client, start, epochs)

    def adapt(self, client: ClientContext, start: Tensor, epochs: int) -> Tensor:
        """A new client's fine-tuning: every layer, ``epochs`` epochs."""
        return client.fit(start, epochs=epochs, purpose="new_client")
