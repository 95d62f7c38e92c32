from __future__ import annotations

from pfl.engine.sam import SAMObjective, sam_context
from pfl.errors import require
from pfl.methods.base import ClientContext, State, Upload
from pfl.methods.fedavg import FedAvg
from pfl.methods.registry import register


@register
class FedSAM(FedAvg):
    """FedSAM (Qu et al., ICML'22; Caldarola et al., ECCV'22): FedAvg with SAM as the local optimizer.

    Each local mini-batch is one SAM step (``pfl.engine.sam``): g = ∇F_B(w), ε = ρ g/‖g‖₂ (the ℓ_p
    maximiser for ``p`` ≠ 2), gradient at w + ε, w restored, optimizer step with that gradient. The
    server averages as FedAvg. ρ = 0 is FedAvg bit for bit. P-model: the global model (``finetune_epochs``
    > 0: fine-tuned with plain SGD, as FedAvg+FT).

    Args:
        rho: radius ρ of the perturbation ball (FedSAM / PLGU: 0.05).
        p: the ℓ_p norm of the ball (2: SAM).
        finetune_epochs: epochs of plain-SGD fine-tuning of the global model per P-model (0: none).
    """

    name = "fedsam"
    description = "FedAvg with SAM local steps: gradient at w + rho*g/||g||, applied at w"

    def __init__(self, rho: float = 0.05, p: float = 2.0, finetune_epochs: int = 0):
        super().__init__(finetune_epochs)
        require(rho >= 0, "method.rho", f"must be >= 0 (got {rho})")
        require(p >= 1, "method.p", f"must be >= 1 (got {p})", "the ℓ_p ball needs p >= 1 (2 is SAM)")
        self.rho, self.p = rho, p

    def local_update(self, client: ClientContext, payload: State) -> Upload:
        trained = client.fit(
            payload["global"],
            terms=self.local_terms(client, payload),
            objective=SAMObjective,
            context=sam_context(self.rho, self.p),
        )
        return Upload(trained, client.num_samples)
