"""pFedHN (Shamsian et al., ICML'21) and PLGU-GHN (PLGU, CVPR'23, supplementary C): a server
hypernetwork h(v_i; φ) emits each client's model; clients train it and return Δw_i.

The hypernetwork (``pfl.optim.hypernet.HyperNetwork``) and its SGD momentum live in the server
state as plain tensors (``hn``, ``hn_momentum``), so checkpoints hold them and a resumed run gives
the same numbers. The method keeps only a module *shell* of the right shape (a pure cache) whose
parameters are pointed at the server state's tensors before each use; the optimizer is rebuilt
around them with its momentum restored. Design and derivations: docs/plgu.md.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from torch import Tensor

from pfl.errors import require
from pfl.methods.base import ClientContext, Method, ServerContext, State, Upload
from pfl.methods.registry import register
from pfl.optim.hypernet import HyperNetwork, hn_sam_server_update, hn_server_update, layer_sizes
from pfl.seeding import torch_generator

SamGradient = Literal["paper", "surrogate"]  # pfl.optim.hypernet.SAM_GRADIENTS


@register
class PFedHN(Method):
    """pFedHN: w_i = h(v_i; φ) is sent to client i, which trains it ``client.epochs`` epochs into
    w_i + Δw_i and uploads Δw_i. The server descends the surrogate ½‖h(v_i; φ) − (w_i + Δw_i)‖²
    (``hn_server_update``: gradient (∂w_i/∂(φ, v_i))ᵀ(−Δw_i), pFedHN's ``grad_outputs = w_i − trained``)
    with SGD (pFedHN's code: lr 1e-2, momentum 0.9, weight decay 1e-3).

    - Several clients per round: one step with φ's gradient averaged over the round's clients and
      each v_i given its own client's gradient (PLGU Eqs. 24–25's 1/|C|); ``per_client=True``: one
      step per client in id order (pFedHN's code trains one client per step; there every later
      client's Jacobian is taken at the already-moved φ).
    - P-model: h(v_i; φ) itself (``finetune_epochs`` > 0: fine-tuned that many epochs on the
      client's train split before it is scored, pFedHN's "personalised" evaluation variant).
      Float buffers (BatchNorm statistics) are not emitted: each client keeps those of its last local
      training (the initial ones before it trains).
    - Hypernetwork: embedding (width ``embed_dim``, pFedHN: 1 + N/4) → ``n_hidden`` linear layers of
      ``hidden`` units (PLGU: 5 × 100) → one head per target layer; layers larger than ``chunk``
      come from a shared chunk generator (``chunk``: 16384 keeps a ResNet-18 hypernetwork smaller
      than its target; docs/plgu.md).
    - No global model: only the hypernetwork is shared.

    Args:
        hn_lr: hypernetwork SGD learning rate (pFedHN: 1e-2).
        hn_momentum: hypernetwork SGD momentum (pFedHN: 0.9).
        hn_weight_decay: hypernetwork weight decay (pFedHN: 1e-3).
        embed_lr: learning rate of the client embeddings (None: hn_lr).
        hidden: width of the hypernetwork's trunk.
        n_hidden: linear layers in the trunk (PLGU: 5; pFedHN's --n-hidden k is k + 1).
        embed_dim: client embedding width (None: 1 + num_clients/4).
        chunk: largest target layer with its own head (None: every layer).
        chunk_embed_dim: width of the chunk embeddings.
        max_grad_norm: clip the hypernetwork gradient norm (pFedHN's code: 50; None: no clipping).
        per_client: one server step per client instead of one per round.
        finetune_epochs: local epochs of fine-tuning before a P-model is scored (0: none).
    """

    name = "pfedhn"
    description = "server hypernetwork emits each client's model; trained on the clients' updates"
    has_global_model = False
    averages_uploads = False  # uploads train a hypernetwork
    _shell: tuple[tuple, HyperNetwork] | None = None

    def __init__(
        self,
        hn_lr: float = 1e-2,
        hn_momentum: float = 0.9,
        hn_weight_decay: float = 1e-3,
        embed_lr: float | None = None,
        hidden: int = 100,
        n_hidden: int = 5,
        embed_dim: int | None = None,
        chunk: int | None = 1 << 17,
        chunk_embed_dim: int = 16,
        max_grad_norm: float | None = None,
        per_client: bool = False,
        finetune_epochs: int = 0,
    ):
        require(hn_lr > 0, "method.hn_lr", f"must be > 0 (got {hn_lr})")
        require(0 <= hn_momentum < 1, "method.hn_momentum", f"must be in [0, 1) (got {hn_momentum})")
        require(hn_weight_decay >= 0, "method.hn_weight_decay", f"must be >= 0 (got {hn_weight_decay})")
        require(embed_lr is None or embed_lr > 0, "method.embed_lr", f"must be > 0 or null (got {embed_lr})")
        require(hidden >= 1, "method.hidden", f"must be >= 1 (got {hidden})")
        require(n_hidden >= 1, "method.n_hidden", f"must be >= 1 (got {n_hidden})")
        require(embed_dim is None or embed_dim >= 1, "method.embed_dim", f"must be >= 1 or null (got {embed_dim})")
        require(chunk is None or chunk >= 1, "method.chunk", f"must be >= 1 or null (got {chunk})")
        require(chunk_embed_dim >= 1, "method.chunk_embed_dim", f"must be >= 1 (got {chunk_embed_dim})")
        require(
            max_grad_norm is None or max_grad_norm > 0, "method.max_grad_norm", f"must be > 0 or null ({max_grad_norm})"
        )
        require(finetune_epochs >= 0, "method.finetune_epochs", f"must be >= 0 (got {finetune_epochs})")
        self.hn_lr, self.hn_momentum, self.hn_weight_decay, self.embed_lr = (
            hn_lr,
            hn_momentum,
            hn_weight_decay,
            embed_lr,
        )
        self.hidden, self.n_hidden, self.embed_dim = hidden, n_hidden, embed_dim
        self.chunk, self.chunk_embed_dim = chunk, chunk_embed_dim
        self.max_grad_norm, self.per_client, self.finetune_epochs = max_grad_norm, per_client, finetune_epochs

    # -- the hypernetwork from the server state ------------------------------------------------------
    def _architecture(self) -> dict:
        return {
            "embed_dim": self.embed_dim,
            "hidden": self.hidden,
            "n_hidden": self.n_hidden,
            "chunk": self.chunk,
            "chunk_embed_dim": self.chunk_embed_dim,
        }

    def build(self, server: ServerContext, generator: torch.Generator) -> HyperNetwork:
        sizes = layer_sizes(server.layout.layer_slices())
        return HyperNetwork(server.num_clients, sizes, generator=generator, **self._architecture()).to(server.device)

    def hypernet(self, server: ServerContext) -> HyperNetwork:
        """The hypernetwork whose parameters are the server state's ``hn`` tensors (shared storage:
        an optimizer step on it updates the state in place)."""
        sizes = tuple(layer_sizes(server.layout.layer_slices()))
        key = (server.num_clients, sizes, str(server.device), tuple(self._architecture().items()))
        if self._shell is None or self._shell[0] != key:
            self._shell = (key, self.build(server, torch.Generator().manual_seed(0)))  # values are replaced below
        hn = self._shell[1]
        tensors = server["hn"]
        for name, p in hn.named_parameters():
            p.data = tensors[name]
            p.grad = None
        return hn

    def optimizer(self, server: ServerContext, hn: HyperNetwork) -> torch.optim.SGD:
        """SGD over the hypernetwork with the momentum saved in the server state."""
        opt = torch.optim.SGD(
            hn.param_groups(self.embed_lr), lr=self.hn_lr, momentum=self.hn_momentum, weight_decay=self.hn_weight_decay
        )
        saved = server.get("hn_momentum", {})
        for name, p in hn.named_parameters():
            if name in saved:
                opt.state[p]["momentum_buffer"] = saved[name]
        return opt

    def init_server(self, server: ServerContext) -> State:
        hn = self.build(server, torch_generator(server.seed, "pfedhn", "init"))
        return {"hn": {k: v.detach().clone() for k, v in hn.state_dict().items()}}

    # -- rounds ---------------------------------------------------------------------------------------
    def payload(self, server: ServerContext, cid: int) -> State:
        with torch.no_grad():
            return {"params": self.hypernet(server)(cid).detach()}

    def local_start(self, client: ClientContext, params: Tensor) -> Tensor:
        """A full state vector: the hypernetwork's parameters, the client's own float buffers."""
        buffers = client.state.get("buffers", client.init_state[client.layout.num_params :])
        return torch.cat([params, buffers])

    def local_update(self, client: ClientContext, payload: State) -> Upload:
        start = self.local_start(client, payload["params"])
        trained = client.fit(start)
        n = client.layout.num_params
        if client.layout.num_buffers:
            client.state["buffers"] = trained[n:].clone()
        return Upload(None, client.num_samples, {"delta": trained[:n] - payload["params"]})

    def server_step(self, hn: HyperNetwork, optimizer: torch.optim.Optimizer, cids: list[int], delta: Tensor) -> None:
        """One hypernetwork step on clients ``cids`` (``delta``: their Δw, stacked)."""
        hn_server_update(hn, optimizer, cids, delta, self.max_grad_norm)

    def aggregate(self, server: ServerContext, uploads: dict[int, Upload]) -> None:
        hn = self.hypernet(server)
        opt = self.optimizer(server, hn)
        cids = sorted(uploads)
        groups = [[c] for c in cids] if self.per_client else [cids]
        for group in groups:
            self.server_step(hn, opt, group, torch.stack([uploads[c]["delta"] for c in group]))
        saved = {}
        for name, p in hn.named_parameters():
            buf = opt.state.get(p, {}).get("momentum_buffer")
            if buf is not None:
                saved[name] = buf
            p.grad = None
        if saved:
            server["hn_momentum"] = saved

    def personal_state(self, server: ServerContext, client: ClientContext) -> Tensor:
        with torch.no_grad():
            state = self.local_start(client, self.hypernet(server)(client.cid))
        if self.finetune_epochs == 0:
            return state
        return client.fit(state, epochs=self.finetune_epochs, purpose="finetune")


@register
class PLGUGHN(PFedHN):
    """PLGU-GHN (PLGU supplementary C, Algorithm 4): pFedHN whose server step takes its gradient at
    the sharpness-perturbed hypernetwork φ + ε (``hn_sam_server_update``, Eqs. 24–25):
    g = mean_i (∂w_i/∂φ)ᵀ(−Δw_i), ε = ρ g/‖g‖ (the ℓ_p maximiser for ``p`` ≠ 2) over φ only (not the
    embeddings), then φ and every v_i descend (∂w_i/∂φ at φ + ε)ᵀ(−Δw_i) (Eq. 24; ``sam_gradient:
    surrogate`` descends the gradient of ½‖h(v_i; φ + ε) − (w_i + Δw_i)‖² instead); φ restored first.
    ρ = 0 is pFedHN bit for bit (tested). The sign is pFedHN's (docs/plgu.md: the paper's printed
    ∇_φ(w_i)ᵀΔw_i would make ε point downhill).

    Args:
        rho: radius ρ of the hypernetwork perturbation (paper: 0.05).
        p: the ℓ_p ball (2: SAM).
        sam_gradient: "paper" (Eq. 24: the clients' Δw_i through the Jacobian at φ + ε) or "surrogate"
            (pFedHN's surrogate loss at φ + ε, which also pulls back against the perturbation itself).
        (the others: as pfedhn)
    """

    name = "plgu_ghn"
    description = "pFedHN with the hypernetwork updated at a SAM-perturbed point (PLGU)"

    def __init__(self, rho: float = 0.05, p: float = 2.0, sam_gradient: SamGradient = "paper", **kwargs: Any):
        super().__init__(**kwargs)  # pFedHN's options
        require(rho >= 0, "method.rho", f"must be >= 0 (got {rho})")
        require(p >= 1, "method.p", f"must be >= 1 (got {p})", "the ℓ_p ball needs p >= 1 (2 is SAM)")
        self.rho, self.p, self.sam_gradient = rho, p, sam_gradient

    def server_step(self, hn: HyperNetwork, optimizer: torch.optim.Optimizer, cids: list[int], delta: Tensor) -> None:
        hn_sam_server_update(hn, optimizer, cids, delta, self.rho, self.p, self.max_grad_norm, self.sam_gradient)
