"""FedORA (Wu et al., KDD'23): personalized FL by parameter propagation over a client-similarity graph.

The math (subspaces, similarities, propagation, selective λ, new-client rows) is in
``pfl.optim.propagation``; this module wires it into rounds. docs/fedora.md has the derivations,
the paper-vs-code list and how the handshake, the stores and new clients are designed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch
from torch import Tensor

from pfl.engine.terms import Proximal, Term, add_scaled_, coefficient
from pfl.errors import require
from pfl.methods.base import ClientContext, Method, ServerContext, State, Upload
from pfl.methods.model_rows import clipped_cosine, row_gram
from pfl.methods.registry import register
from pfl.optim.propagation import (
    PAPER_EPS,
    new_client_row,
    official_similarity,
    principal_angle_similarity,
    propagate,
    propagate_iterative,
    propagation_matrix,
    selective_lambda,
    similarity,
    subspace_basis,
)
from pfl.seeding import torch_generator

Similarity = Literal["subspace", "official", "random", "parameter", "gradient", "identity", "uniform"]
Propagation = Literal["closed", "iterative"]
Pull = Literal["gradient", "decoupled"]
_F64 = torch.float64
LambdaRule = Literal["paper", "official"]  # pfl.optim.propagation.LAMBDA_RULES


class DecoupledPull(Term):
    """The authors' code's regulariser: after each optimizer step, θ ← θ − η·λ·(θ_before − θ̂) with
    θ_before the weights before that step; outside the momentum buffer. Its gradient form is
    (λ/2)‖θ − θ̂‖², half the paper's λ‖θ − θ̂‖² of Eq. (9)."""

    def __init__(self, anchor: Tensor, lam: float):
        self.anchor, self.lam = anchor, lam
        self.before = torch.empty_like(anchor)

    def on_grad(self, params: Tensor, grads: Tensor) -> None:
        self.before.copy_(params)

    def on_step(self, params: Tensor, lr: float) -> None:
        c = lr * self.lam
        params.add_(self.before, alpha=-c).add_(self.anchor, alpha=c)

    @classmethod
    def stack(cls, terms: Sequence[DecoupledPull]) -> Term:
        return _DecoupledPullRows(terms)


class _DecoupledPullRows(Term):
    """``DecoupledPull`` for a stack of clients (``pfl.engine.stacked``): one anchor row and λ per client."""

    def __init__(self, terms: Sequence[DecoupledPull]):
        self.anchor = torch.stack([t.anchor.reshape(-1) for t in terms])
        self.lam = coefficient([t.lam for t in terms], self.anchor)
        self.before = torch.empty_like(self.anchor)

    def on_grad(self, params: Tensor, grads: Tensor) -> None:
        self.before.copy_(params)

    def on_step(self, params: Tensor, lr: float | Tensor) -> None:
        c = lr * self.lam  # float64 (Python floats or a column), as the sequential hook's product
        add_scaled_(add_scaled_(params, self.before, -c), self.anchor, c)


@register
class FedORA(Method):
    """FedORA: the server propagates the clients' parameters Θ (K, S) over a similarity graph W,
    Θ̂ = (1−κ)(I − κD⁻¹W)⁻¹Θ (κ = α/(1+α); Eq. 6) or by the iteration Eq. (7); client k gets θ̂_k, sets
    λ_k = max(ε, L̃_k(θ_k) − L̃_k(θ̂_k)) on its validation split (Eq. 8) and trains its own θ_k for E
    epochs on loss + λ_k‖θ_k − θ̂_k‖² (Eq. 9, i.e. ``Proximal(θ̂_k, mu=2λ_k)``), then uploads θ_k.

    Similarity (``similarity``): ``subspace`` (the paper: Σ cos of the principal angles between the
    clients' top-``p`` bases of [x, onehot(y)], uploaded once), ``official`` (the authors' code: top-2
    neighbours of exp(10·w), row-normalised), the Table 4 ablations ``random``, ``parameter`` (clipped
    cosine of θ_k − θ_0, recomputed every round), ``gradient`` (clipped cosine of each client's last
    update θ_k^new − θ_k^old), and Lemma 4.1's ``identity`` (LOCAL) and ``uniform`` (w_kk' = n_k').

    Handshake: the server requests a client's basis in the payload the first time it samples the
    client, and the client sends it with that round's upload; a client joins the graph at its first
    upload (until then its row and column of W hold only its self-similarity, so an untrained θ_k = θ_0
    is never propagated to anyone). With full participation (the paper's and the code's setting) every
    basis is on the server before the first propagation, exactly Algorithm 1. Bases, W, M and the
    stores are server state, so a resumed run continues with them.

    Stores: ``theta`` (K, S), the last θ_k uploaded, and ``theta_hat`` (K, S) = MΘ, computed by one
    (chunked) matmul per round into the same buffer. ``replace_server_copy`` (the authors' code) keeps
    one store: the uploaded θ_k overwrite their rows of Θ̂ and the whole store is propagated in place
    (the same as the paper's with full participation; with partial participation absent clients
    contribute their θ̂ rather than their θ).

    Args:
        alpha: α of Eq. (1) (κ = α/(1+α)); the paper uses 1.
        kappa: κ directly (the code's "propagation factor" 0.8); give alpha or kappa.
        p: directions of each client's subspace (the paper: 1).
        similarity: subspace | official | random | parameter | gradient | identity | uniform.
        propagation: closed (Eq. 6, one K×K solve when W changes, one matmul per round) | iterative (Eq. 7).
        iters, tol: stopping rule of the iteration (at least one of them).
        lambda_rule: paper (max(ε, Δ)) | official (exp(Δ/2) if Δ ≥ 0 else 0); Δ from mean validation losses.
        lam: a constant λ_k for every client (Table 5); None: Eq. (8).
        eps: ε of Eq. (8).
        pull: gradient (Eq. 9: gradient of λ‖θ − θ̂‖²) | decoupled (the code's post-step pull, λ/2 scale).
        replace_server_copy: the code's single in-place store (see above).
        top_k, temperature: the official graph's neighbours and exp scale.
        label_scale, center: subspace options (see ``subspace_basis``).
        new_client_labels: held-out clients are labeled (subspace of [x, y], fine-tuned with Eq. 9 for
            ``eval.new_client_epochs``) or unlabeled (feature-only subspaces on every client, θ̂ used as is).
    """

    name = "fedora"
    description = "parameter propagation over a data-subspace similarity graph + selective regularization"
    has_global_model = False
    averages_uploads = False  # one model per client, propagated over a graph

    def __init__(
        self,
        alpha: float | None = 1.0,
        kappa: float | None = None,
        p: int = 1,
        similarity: Similarity = "subspace",
        propagation: Propagation = "closed",
        iters: int | None = None,
        tol: float | None = 1e-7,
        lambda_rule: LambdaRule = "paper",
        lam: float | None = None,
        eps: float = PAPER_EPS,
        pull: Pull = "gradient",
        replace_server_copy: bool = False,
        top_k: int = 2,
        temperature: float = 10.0,
        label_scale: float = 1.0,
        center: bool = False,
        new_client_labels: bool = True,
    ):
        require(
            (alpha is None) != (kappa is None),
            "method.alpha",
            f"give exactly one of alpha and kappa (got alpha={alpha}, kappa={kappa})",
            "set the other to null",
        )
        if alpha is not None:
            require(alpha >= 0 and alpha != float("inf"), "method.alpha", f"must be finite and >= 0 (got {alpha})")
        if kappa is not None:
            require(0 <= kappa < 1, "method.kappa", f"must be in [0, 1) (got {kappa})")
        require(p >= 1, "method.p", f"must be >= 1 (got {p})")
        require(iters is None or iters >= 1, "method.iters", f"must be >= 1 (got {iters})")
        require(tol is None or tol > 0, "method.tol", f"must be > 0 (got {tol})")
        require(
            propagation == "closed" or iters is not None or tol is not None,
            "method.tol",
            "the iterative propagation needs iters and/or tol",
        )
        require(lam is None or lam >= 0, "method.lam", f"a constant lambda must be >= 0 (got {lam})")
        require(eps > 0, "method.eps", f"must be > 0 (got {eps})")
        require(top_k >= 1, "method.top_k", f"must be >= 1 (got {top_k})")
        require(label_scale > 0, "method.label_scale", f"must be > 0 (got {label_scale})")
        self.alpha, self.kappa, self.p, self.similarity = alpha, kappa, p, similarity
        self.propagation, self.iters, self.tol = propagation, iters, tol
        self.lambda_rule, self.lam, self.eps, self.pull = lambda_rule, lam, eps, pull
        self.replace_server_copy, self.top_k, self.temperature = replace_server_copy, top_k, temperature
        self.label_scale, self.center, self.new_client_labels = label_scale, center, new_client_labels

    # -- what the similarity needs ------------------------------------------------------------------
    @property
    def _uses_bases(self) -> bool:
        return self.similarity in ("subspace", "official")

    @property
    def _keeps_theta(self) -> bool:
        """Θ (last uploads) is a store of its own unless the code's single store is used; the
        parameter/gradient similarities read it too."""
        return not self.replace_server_copy or self.similarity in ("parameter", "gradient")

    # -- server ---------------------------------------------------------------------------------------
    def init_server(self, server: ServerContext) -> State:
        k = server.num_clients
        store = server.init_state.unsqueeze(0).repeat(k, 1)
        state: State = {
            "theta_hat": store,
            "seen": torch.zeros(k, dtype=torch.bool, device=server.device),
            "sizes": torch.zeros(k, dtype=_F64, device=server.device),
            "W": torch.eye(k, dtype=_F64),
        }
        if self._keeps_theta:
            state["theta"] = store.clone()
        if self.similarity == "gradient":
            state["updates"] = torch.zeros_like(store)
        if self.similarity == "random":
            gen = torch_generator(server.seed, "fedora", "random_similarity")
            state["W_random"] = similarity("random", num_clients=k, generator=gen)
        if self.propagation == "closed":
            state["M"] = torch.eye(k, dtype=_F64)
        return state

    def payload(self, server: ServerContext, cid: int) -> State:
        out = {"theta_hat": server["theta_hat"][cid]}
        if not bool(server["seen"][cid]) and (self._uses_bases or not self.new_client_labels):
            out["send_basis"] = torch.ones((), dtype=torch.bool, device=server.device)
        return out

    def aggregate(self, server: ServerContext, uploads: dict[int, Upload]) -> None:
        cids = sorted(uploads)
        joined = [c for c in cids if not bool(server["seen"][c])]
        for cid in joined:
            self._store_bases(server, cid, uploads[cid])
            server["sizes"][cid] = float(uploads[cid].weight)
            server["seen"][cid] = True
        for cid in cids:
            state = uploads[cid].state
            if self.similarity == "gradient":
                server["updates"][cid] = state - server["theta"][cid]
            if "theta" in server:
                server["theta"][cid] = state
            if self.replace_server_copy:
                server["theta_hat"][cid] = state
        if joined or self.similarity in ("parameter", "gradient"):
            server["W"] = self._graph(server)
            if self.propagation == "closed":
                server["M"] = propagation_matrix(server["W"].cpu(), self.alpha, kappa=self.kappa)
        self._propagate(server)

    def _store_bases(self, server: ServerContext, cid: int, upload: Upload) -> None:
        for key, store in (("basis", "bases"), ("basis_x", "bases_x")):
            if key in upload:
                basis = upload[key].detach().to("cpu", _F64)
                if store not in server:  # (K, D, p): D is known at the first upload
                    server[store] = torch.zeros(server.num_clients, *basis.shape, dtype=_F64)
                server[store][cid] = basis

    def _graph(self, server: ServerContext) -> Tensor:
        """W (K, K) float64 on the CPU; clients not yet seen keep only a self-loop (isolated)."""
        k = server.num_clients
        seen = server["seen"].cpu()
        idx = seen.nonzero().flatten()
        w = torch.eye(k, dtype=_F64)
        if len(idx) == 0:
            return w
        block = idx[:, None], idx[None, :]
        kind = self.similarity
        if kind == "subspace":
            w.diagonal().fill_(float(self.p))
            w[block] = principal_angle_similarity(server["bases"].cpu()[idx])
        elif kind == "official":
            if len(idx) >= 2:
                sim = principal_angle_similarity(server["bases"].cpu()[idx])
                w[block] = official_similarity(sim, top_k=self.top_k, temperature=self.temperature)
        elif kind == "random":
            w[block] = server["W_random"].cpu()[block]
        elif kind in ("parameter", "gradient"):  # Gram of the whole store in column blocks (no row copy)
            cols = server.layout.num_params
            if kind == "parameter":
                gram = row_gram(server["theta"], server.init_state, cols=cols)
            else:
                gram = row_gram(server["updates"], cols=cols)
            w[block] = clipped_cosine(gram[block])
        elif kind == "uniform":
            w[block] = server["sizes"].cpu()[idx][None, :].expand(len(idx), len(idx))
        return w

    def _propagate(self, server: ServerContext) -> None:
        hat = server["theta_hat"]
        source = hat if self.replace_server_copy else server["theta"]
        if self.propagation == "closed":
            propagate(server["M"], source, out=hat)  # in place when source is hat: column blocks
        else:
            w = server["W"].cpu()
            hat.copy_(propagate_iterative(w, source, self.alpha, kappa=self.kappa, iters=self.iters, tol=self.tol))

    # -- client ---------------------------------------------------------------------------------------
    def local_update(self, client: ClientContext, payload: State) -> Upload:
        hat = payload["theta_hat"]
        own = client.state.get("personal", client.init_state)
        lam = self.selective_lambda(client, own, hat)
        trained = client.fit(own, terms=[self.pull_term(client, hat, lam)])
        client.state["personal"] = trained
        extras: dict[str, Tensor] = {}
        if "send_basis" in payload:
            if self._uses_bases:
                extras["basis"] = self.client_basis(client, labels=True)
            if not self.new_client_labels:
                extras["basis_x"] = self.client_basis(client, labels=False)
        return Upload(trained, client.num_samples, extras)

    def personal_state(self, server: ServerContext, client: ClientContext) -> Tensor:
        return client.state.get("personal", client.init_state)

    def pull_term(self, client: ClientContext, hat: Tensor, lam: float) -> Term:
        """λ‖θ − θ̂‖² of Eq. (9) (gradient 2λ(θ − θ̂)), or the code's decoupled post-step pull."""
        anchor = client.params(hat)
        return Proximal(anchor, 2.0 * lam) if self.pull == "gradient" else DecoupledPull(anchor, lam)

    def selective_lambda(self, client: ClientContext, own: Tensor, hat: Tensor) -> float:
        """λ_k of Eq. (8) on the client's validation split, or the constant ``lam``. A client without a
        validation split uses its train split: θ_k was fitted on it, so Δ is biased towards θ_k and the
        client leans to local training, the safe side against negative transfer."""
        if self.lam is not None:
            return float(self.lam)
        idx = client.val_idx if len(client.val_idx) else client.train_idx
        # L̃_k is the sample-mean loss for both rules: the code's sum of per-batch means equals it on its
        # single validation batch of 64, but grows with the number of batches (a big client with 15
        # batches got an exponentially large λ = exp(Δ/2) and diverged).
        own_loss, hat_loss = client.evaluate(own, idx).loss, client.evaluate(hat, idx).loss
        return selective_lambda(own_loss, hat_loss, self.eps, self.lambda_rule)

    def client_basis(self, client: ClientContext, labels: bool) -> Tensor:
        """The client's top-p subspace basis (D, p) of its training samples: [x, onehot(y)] with labels
        (regression: [x, y], the target as one real column), x alone without."""
        x, y = client.train_samples()
        x, y = x.reshape(len(x), -1).to("cpu", _F64), y.cpu()
        if labels and y.is_floating_point():
            x = torch.cat([x, self.label_scale * y.to(_F64)[:, None]], dim=1)
        use_y = y if labels and not y.is_floating_point() else None
        basis = subspace_basis(x, use_y, client.num_classes, self.p, center=self.center, label_scale=self.label_scale)
        return basis.to(client.init_state.device)

    # -- new clients (Section 4.3, Algorithm 2) ---------------------------------------------------------
    def new_client_hat(self, server: ServerContext, client: ClientContext) -> Tensor:
        """θ̂ of a held-out client from its similarity to the trained clients that have joined: its
        subspace against theirs (feature-only when ``new_client_labels`` is false), the official graph's
        top-k row for ``similarity: official``, and θ̂_new = Σ_k (w_k / Σw) θ̂_k (``new_client_row``:
        the new client has no parameters of its own before it fine-tunes). The ablation kinds have no
        client subspaces; they use the sample-weighted average of the trained θ̂ (Lemma 4.1's row)."""
        seen = server["seen"].cpu()
        idx = seen.nonzero().flatten()
        require(len(idx) > 0, "method.similarity", "no trained client has joined the graph yet")
        key = "bases" if self.new_client_labels else "bases_x"
        if self._uses_bases or not self.new_client_labels:
            mine = self.client_basis(client, labels=self.new_client_labels).to("cpu", _F64)
            sim = principal_angle_similarity(server[key].cpu()[idx], mine[None])[:, 0][None, :]  # (1, K_seen)
            if self.similarity == "official":
                sim = official_similarity(sim, top_k=self.top_k, temperature=self.temperature, cross=True)
        else:
            sim = server["sizes"].cpu()[idx][None, :]
        row = new_client_row(sim)[0]
        hats = server["theta_hat"][idx.to(server["theta_hat"].device)]
        return row.to(hats.dtype).to(hats.device) @ hats

    def adapt_new_client(self, server: ServerContext, client: ClientContext, epochs: int) -> Tensor:
        """Labeled: fine-tune from θ̂_new for ``epochs`` epochs with Eq. (9), λ re-estimated by Eq. (8)
        before each epoch (θ_new starts at θ̂_new, so the first λ is ε). Unlabeled: θ̂_new itself (the
        optimum of Eq. (2) without a data term)."""
        hat = self.new_client_hat(server, client)
        if not self.new_client_labels or epochs == 0:
            return hat
        theta = hat.clone()
        for e in range(epochs):
            lam = self.selective_lambda(client, theta, hat)
            theta = client.fit(theta, epochs=1, terms=[self.pull_term(client, hat, lam)], purpose=f"new_client{e}")
        return theta
