from __future__ import annotations

from torch import Tensor, nn
from torch.func import functional_call

from pfl.engine.terms import ExtraParamSGD
from pfl.errors import require
from pfl.methods.base import ClientContext, ServerContext, State, Upload
from pfl.methods.fedavg import FedAvg
from pfl.methods.registry import register


@register
class APFL(FedAvg):
    """APFL (Deng et al. 2020): each client trains its copy w of the global model (FedAvg) and, in
    the same steps, a personal model v on the loss of the mixture v̄ = α·v + (1 − α)·w; the P-model
    is v̄ with the client's last locally trained w. α is fixed (``mix``); v is trained with plain SGD
    at ``client.lr``."""

    name = "apfl"
    description = "FedAvg model w + personal v trained through the mixture mix*v + (1-mix)*w"
    has_personal_model = True

    def __init__(self, mix: float = 0.5):
        super().__init__(finetune_epochs=0)
        require(0 <= mix <= 1, "method.mix", f"the mixing weight must be in [0, 1] (got {mix})")
        self.mix = mix

    def local_update(self, client: ClientContext, payload: State) -> Upload:
        flat = client.flat
        v = client.state.get("v", client.params(client.init_state)).clone().requires_grad_(True)
        a = self.mix
        loss, squeeze = client.worker.module.loss, client.worker.task == "regression"  # MSE on (B,) outputs

        def loss_fn(net: nn.Module, x: Tensor, y: Tensor) -> Tensor:
            mixed = a * v + (1 - a) * flat.params.detach()  # w's own step uses only its own loss
            out, own = functional_call(net, flat.param_dict(mixed), (x,)), net(x)
            if squeeze:
                out, own = out.squeeze(-1), own.squeeze(-1)
            return loss(own, y) + loss(out, y)

        w = client.fit(payload["global"], loss_fn=loss_fn, terms=[ExtraParamSGD(v)])
        v = v.detach()
        client.state["v"] = v
        personal = w.clone()
        client.params(personal).copy_(a * v + (1 - a) * client.params(w))
        client.state["personal"] = personal
        return Upload(w, client.num_samples)

    def personal_state(self, server: ServerContext, client: ClientContext) -> Tensor:
        return client.state.get("personal", client.init_state)
