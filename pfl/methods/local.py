from __future__ import annotations

from pfl.methods.base import ClientContext, ClientOptimizerMethod, ServerContext, State, Upload
from pfl.methods.registry import register


@register
class Local(ClientOptimizerMethod):
    """Local: every client trains its own model from a common initialisation; nothing is shared.

    Args:
    """

    name = "local"
    description = "each client trains alone (the reference for gain, R-Acc and PTR)"
    has_global_model = False
    averages_uploads = False  # no server model

    def init_server(self, server: ServerContext) -> State:
        return {}

    def payload(self, server: ServerContext, cid: int) -> State:
        return {}

    def local_update(self, client: ClientContext, payload: State) -> Upload:
        client.state["personal"] = client.fit(client.state.get("personal", client.init_state))
        return Upload()

    def aggregate(self, server: ServerContext, uploads: dict[int, Upload]) -> None:
        pass
