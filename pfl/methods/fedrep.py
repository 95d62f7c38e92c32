from __future__ import annotations

from typing import Any

from torch import Tensor

from pfl.engine.terms import Freeze
from pfl.errors import require
from pfl.methods.base import ClientContext
from pfl.methods.fedper import FedPer
from pfl.methods.registry import register


@register
class FedRep(FedPer):
    """FedRep (Collins et al. 2021): ``head_epochs`` epochs on the personal head with the body frozen,
    then ``client.epochs`` on the shared body with the head frozen.

    A new client takes the server's body and the initial head and learns its head on the frozen body
    (``eval.new_client_epochs`` epochs), as the paper adapts new clients; with ``adapt_body`` it then
    also trains the body (head frozen) for as many epochs, i.e. one FedRep local update.
    Its other options are FedPer's; ``client_momentum`` applies to both fits, ``keep_momentum`` to the
    body's.

    Args:
        head_epochs: epochs on the head (body frozen) before the body epochs.
        adapt_body: new clients also train the body after their head.
    """

    name = "fedrep"
    description = "head epochs with the body frozen, then body epochs with the head frozen; bodies averaged"

    def __init__(
        self,
        head_epochs: int = 1,
        adapt_body: bool = False,
        **kwargs: Any,
    ):
        super().__init__(**kwargs)
        require(head_epochs >= 0, "method.head_epochs", f"must be >= 0 (got {head_epochs})")
        self.head_epochs, self.adapt_body = head_epochs, adapt_body

    def parts(self, client: ClientContext) -> tuple[slice, slice]:
        """(head, body) parameter slices."""
        head = client.layout.tail(self.personal_layers)
        return head, slice(0, head.start)

    def train(self, client: ClientContext, start: Tensor) -> Tensor:
        head, body = self.parts(client)
        state = start
        if self.head_epochs > 0:
            frozen = Freeze(client.params(state), body)
            state = client.fit(state, epochs=self.head_epochs, terms=[frozen], purpose="head")
        return client.fit(state, terms=[Freeze(client.params(state), head)])

    def adapt(self, client: ClientContext, start: Tensor, epochs: int) -> Tensor:
        head, body = self.parts(client)
        state = client.fit(start, epochs=epochs, terms=[Freeze(client.params(start), body)], purpose="new_client")
        if self.adapt_body:
            frozen = Freeze(client.params(state), head)
            state = client.fit(state, epochs=epochs, terms=[frozen], purpose="new_client_body")
        return state
