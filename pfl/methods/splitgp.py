"""SplitGP (Han, Kim, Choi, Brinton & Moon, "SplitGP: Achieving both generalization and
personalization in federated learning", 2022): a split model whose client-side part has its own head.

The network (an nn.Sequential, possibly nested, e.g. pfl's mlp and cnn) is cut after its first
``client_layers`` parametrised layers (ModelLayout.layers; the parameter-free modules that follow a
layer, such as ReLU, pooling and flatten, stay on its side): φ, the client-side part, and θ, the
server-side part (the remaining layers). Each client also keeps its own head κ_i, a personal copy of θ's
layers (for the default cut, all layers but the classifier, κ_i and θ are linear classifiers on the
same features, which is SplitGP's auxiliary classifier; for an earlier cut κ_i replicates the
server-side layers, so that the client-side model is a network of the same architecture that pfl's
evaluation can run — the paper uses a single linear auxiliary classifier there).

Round t: client i receives (φ, θ), starts κ_i from its last value (θ's initial value the first time)
and trains all three for ``client.epochs`` on

    λ · ℓ(κ_i(φ(x)), y) + (1 − λ) · ℓ(θ(φ(x)), y)

(the split-learning exchange of activations and their gradients per batch is simulated in one process
and not counted; the client uploads (φ_i, θ_i) as one model). The server averages (φ, θ) by samples
(FedAvg). The P-model of client i is its client-side model (φ_i, κ_i) as trained in its last round
(the personalized predictor); the G-model is (φ, θ). λ = 0.2 is SplitGP's choice.

Inference (``routing``): client i predicts a sample with (φ_i, κ_i) when the entropy of that output is
below ``entropy_threshold`` (E_th, in nats) and otherwise sends φ_i(x) to the server, which predicts
with θ(φ_i(x)); pfl.metrics.routing scores that rule on every evaluated set (``route.*`` metrics).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call

from pfl.engine.flat import ModelLayout
from pfl.engine.stacked_loss import ParamsAt, StackedLoss
from pfl.engine.terms import ExtraParamSGD
from pfl.errors import ConfigError, require
from pfl.methods.base import ClientContext, Method, ServerContext, State, Upload
from pfl.methods.registry import register

# E_th in nats; see docs/paper_vs_code.md (SplitGP) for how the default was chosen.
ENTROPY_THRESHOLD = 0.5


def leaves(net: nn.Module) -> list[nn.Module]:
    """The modules of a (nested) nn.Sequential in forward order."""
    if isinstance(net, nn.Sequential):
        return [leaf for child in net for leaf in leaves(child)]
    return [net]


def split_sequential(net: nn.Module, k: int) -> tuple[nn.Sequential, nn.Sequential]:
    """(client part, server part) of a Sequential cut after its k-th parametrised leaf module."""
    if not isinstance(net, nn.Sequential):
        raise ConfigError("model.name", "splitgp needs an nn.Sequential model", "use mlp, cnn or logreg")
    mods = leaves(net)
    with_params = [i for i, mod in enumerate(mods) if any(True for _ in mod.parameters(recurse=True))]
    if not 1 <= k < len(with_params):
        raise ConfigError("method.client_layers", f"must be in [1, {len(with_params) - 1}] for this model (got {k})")
    cut = with_params[k]
    return nn.Sequential(*mods[:cut]), nn.Sequential(*mods[cut:])


def data_loss(out: Tensor, y: Tensor, reduction: str = "mean") -> Tensor:
    if y.is_floating_point():
        return F.mse_loss(out.squeeze(-1), y, reduction=reduction)
    return F.cross_entropy(out, y, reduction=reduction)


def split_loss(
    phi: nn.Module, theta: nn.Module, head: Tensor, lam: float, x: Tensor, y: Tensor, reduction: str = "mean"
) -> Tensor:
    """SplitGP's local loss: λ · ℓ(κ_i(φ(x)), y) + (1 − λ) · ℓ(θ(φ(x)), y), κ_i the flat ``head``."""
    h = phi(x)
    out_server = theta(h)
    out_client = functional_call(theta, _params_of(theta, head), (h,))
    return lam * data_loss(out_client, y, reduction) + (1.0 - lam) * data_loss(out_server, y, reduction)


@dataclass(frozen=True)
class SplitLoss:
    """``split_loss`` per sample, as trained stacked (``pfl.engine.stacked_loss``): κ_i is each client's."""

    phi: nn.Module
    theta: nn.Module
    lam: float

    def __call__(self, at: ParamsAt, p: Tensor, head: Tensor, x: Tensor, y: Tensor) -> Tensor:
        return at.run(p, split_loss, self.phi, self.theta, head, self.lam, x, y, "none")


@register
class SplitGP(Method):
    """SplitGP (see the module doc).

    Args:
        lam: λ ∈ [0, 1], the weight of the client-side (personal) output in the local loss.
        client_layers: the cut, as a count of parametrised layers on the client side (None: all but
            the last, so the server-side part is the classifier).
        head_lr: learning rate of κ_i (None: client.lr).
        entropy_threshold: E_th ≥ 0 of the inference rule, in nats (0: every sample goes to the
            server; above log(#classes): none does); None leaves the routed evaluation out.
    """

    name = "splitgp"
    description = "split model: client-side part with its own head (personal) + server-side part (global)"
    has_personal_model = True

    def __init__(
        self,
        lam: float = 0.2,
        client_layers: int | None = None,
        head_lr: float | None = None,
        entropy_threshold: float | None = ENTROPY_THRESHOLD,
    ):
        require(0 <= lam <= 1, "method.lam", f"must be in [0, 1] (got {lam})")
        require(client_layers is None or client_layers >= 1, "method.client_layers", "must be >= 1, or null")
        require(head_lr is None or head_lr > 0, "method.head_lr", "must be > 0, or null for client.lr")
        require(
            entropy_threshold is None or 0 <= entropy_threshold < math.inf,
            "method.entropy_threshold",
            f"must be a finite number >= 0 (nats), or null for no routed evaluation (got {entropy_threshold})",
        )
        self.lam, self.client_layers, self.head_lr = lam, client_layers, head_lr
        self.entropy_threshold = entropy_threshold
        self._split: tuple[nn.Module, nn.Sequential, nn.Sequential] | None = None  # cache per network

    def cut(self, layout: ModelLayout) -> int:
        k = layout.num_layers - 1 if self.client_layers is None else self.client_layers
        require(
            1 <= k < layout.num_layers,
            "method.client_layers",
            f"must be in [1, {layout.num_layers - 1}] for this model (got {k})",
            "the model's layers are its parametrised modules",
        )
        return k

    def head_slice(self, layout: ModelLayout) -> slice:
        """The server-side part θ (= the shape of κ_i) in the parameter vector."""
        return layout.tail(layout.num_layers - self.cut(layout))

    def parts(self, net: nn.Module, layout: ModelLayout) -> tuple[nn.Sequential, nn.Sequential]:
        if self._split is None or self._split[0] is not net:
            self._split = (net, *split_sequential(net, self.cut(layout)))
        return self._split[1], self._split[2]

    def init_server(self, server: ServerContext) -> State:
        self.cut(server.layout)  # a bad cut fails before any training
        return super().init_server(server)

    def local_update(self, client: ClientContext, payload: State) -> Upload:
        w = payload["global"]
        tail = self.head_slice(client.layout)
        head = client.state.get("head", client.init_state[tail]).clone().requires_grad_(True)
        lam = self.lam

        def loss_fn(net: nn.Module, x: Tensor, y: Tensor) -> Tensor:
            return split_loss(*self.parts(net, client.layout), head, lam, x, y)

        head_step = ExtraParamSGD(head, self.head_lr)
        stacked = StackedLoss(SplitLoss(*self.parts(client.flat.module, client.layout), lam), head_step)
        trained = client.fit(w, loss_fn=loss_fn, terms=[head_step], stacked_loss=stacked)
        head = head.detach()
        client.state["head"] = head
        personal = trained.clone()
        personal[tail] = head
        client.state["personal"] = personal
        return Upload(trained, client.num_samples)

    def personal_state(self, server: ServerContext, client: ClientContext) -> Tensor:
        return client.state.get("personal", server["global"])

    def routing(self, server: ServerContext, client: ClientContext) -> tuple[Tensor, Tensor, float] | None:
        """(client-side model (φ_i, κ_i), full model (φ_i, θ), E_th) of SplitGP's inference rule: the
        server completes a routed sample with its own θ on the client's features φ_i(x)."""
        if self.entropy_threshold is None:
            return None
        personal = self.personal_state(server, client)
        full = personal.clone()
        tail = self.head_slice(server.layout)
        full[tail] = server["global"][tail]
        return personal, full, self.entropy_threshold


def _params_of(module: nn.Module, flat: Tensor) -> dict[str, Tensor]:
    """Named views of ``flat`` shaped like ``module``'s parameters, in their (flat-vector) order."""
    out, offset = {}, 0
    for name, p in module.named_parameters():
        out[name] = flat[offset : offset + p.numel()].view_as(p)
        offset += p.numel()
    return out
