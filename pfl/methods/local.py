from __future__ import annotations

from pfl.methods.base import ClientContext, Method, ServerContext, State, Upload
from pfl.methods.registry import register


@register
class Local(Method):
    """Local: every client trains its own model from a common initialisation; nothing is shared.

    Args:
        client_momentum: SGD momentum of the local fit (null: client.momentum).
        keep_momentum: keep each client's SGD momentum across rounds (null: client.keep_momentum).
    """

    name = "local"
    vectorizable = True  # the update passes the trained state on without reading it
    description = "each client trains alone (the reference for gain, R-Acc and PTR)"
    has_global_model = False

    def __init__(self, client_momentum: float | None = None, keep_momentum: bool | None = None):
        self.set_client_optimizer(client_momentum, keep_momentum)

    def init_server(self, server: ServerContext) -> State:
        return {}

    def payload(self, server: ServerContext, cid: int) -> State:
        return {}

    def local_update(self, client: ClientContext, payload: State) -> Upload:
        client.state["personal"] = client.fit(client.state.get("personal", client.init_state))
        return Upload()

    def aggregate(self, server: ServerContext, uploads: dict[int, Upload]) -> None:
        pass
