from __future__ import annotations

from typing import Any

from pfl.methods.base import ClientContext, Method, State


class Local(Method):
    """Local: every client trains its own model from a common initialisation; nothing is shared."""

    name = "local"
    description = "each client trains alone (the reference for gain, R-Acc and PTR)"
    has_global_model = False

    def init_server(self, init_state) -> State:
        return {}

    def payload(self, server: State, cid: int) -> State:
        return {}

    def local_update(self, client: ClientContext, payload: State) -> dict[str, Any]:
        client.state["personal"] = client.fit(self.personal_state({}, client))
        return {}

    def aggregate(self, server: State, results: dict[int, dict[str, Any]]) -> None:
        pass

    def personal_state(self, server: State, client: ClientContext):
        return client.state.get("personal", client.init_state)
