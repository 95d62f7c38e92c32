from __future__ import annotations

from typing import Any, Literal

from pfl.engine.objectives import ProximalObjective
from pfl.engine.terms import Proximal, ProximalStep
from pfl.errors import require
from pfl.methods.base import ClientContext, ServerContext, State, Upload
from pfl.methods.fedavg import PersonalFedAvg
from pfl.methods.registry import register

ProxMode = Literal["exact", "gradient", "autograd"]


@register
class Ditto(PersonalFedAvg):
    """Ditto: FedAvg for the global model w; each client also keeps a personal model v trained on
    f_i(v) + λ/2·‖v − w‖².

    ``prox="gradient"`` (the default) adds λ(v − w) to the gradient: one SGD step on the whole personal
    objective, as the paper's Algorithm 1 and the official code take it. ``prox="exact"`` takes the
    λ-term as an exact proximal step after each SGD step on f_i, v ← (v + ηλw)/(1 + ηλ): equal to the
    gradient step to first order in ηλ, and stable for any λ (λ → ∞ gives v = w, where the gradient
    step diverges once ηλ > 2). ``prox="autograd"`` writes the same objective as a Lightning ``training_step``
    (``pfl.engine.objectives.ProximalObjective``) and lets autograd take its gradient.
    ``client_momentum`` applies to both fits, ``keep_momentum`` to the global model's; the personal fit
    starts from zero momentum.

    Args:
        lam: λ, pull of the personal model towards the global model.
        personal_epochs: local epochs on the personal model per participation.
        prox: gradient (the paper's Algorithm 1 and the official code), exact (the λ-term as an
            exact proximal step, stable for any λ) or autograd (the gradient form as a training_step).
    """

    name = "ditto"
    description = "FedAvg global model + personal models regularised towards it by lam/2*||v - w||^2"

    def __init__(
        self,
        lam: float = 0.75,
        personal_epochs: int = 1,
        prox: ProxMode = "gradient",
        **kwargs: Any,
    ):
        super().__init__(**kwargs)
        require(lam >= 0, "method.lam", f"must be >= 0 (got {lam})")
        require(personal_epochs >= 1, "method.personal_epochs", f"must be >= 1 (got {personal_epochs})")
        self.lam, self.personal_epochs, self.prox = lam, personal_epochs, prox

    def vectorize_problems(self) -> list[str]:
        if self.prox == "autograd":
            return self.runs_one_at_a_time("prox=autograd personal fit is a custom objective (use exact or gradient)")
        return super().vectorize_problems()

    def local_update(self, client: ClientContext, payload: State) -> Upload:
        anchor = client.params(payload["global"])
        start = client.state.get("personal", client.init_state)
        fit = {"epochs": self.personal_epochs, "purpose": "personal"}
        if self.prox == "autograd":
            context = {"anchor": anchor, "mu": self.lam}
            client.state["personal"] = client.fit(start, objective=ProximalObjective, context=context, **fit)
        else:
            term = Proximal(anchor, self.lam) if self.prox == "gradient" else ProximalStep(anchor, self.lam)
            client.state["personal"] = client.fit(start, terms=[term], **fit)
        return super().local_update(client, payload)

    def personal_state(self, server: ServerContext, client: ClientContext):
        return client.state.get("personal", client.init_state)
