"""pFedHN's server hypernetwork (Shamsian et al., ICML'21) for flat targets of any size, its server
update, and PLGU-GHN's sharpness-aware variant (PLGU supplementary C, Eqs. 24–25).

h(v_i; φ) maps client i's embedding v_i to the client's whole flat parameter vector w_i, laid out
like ``FlatModule.params``: one block per target layer (a parametrised module, weight and bias
together, as in ``ModelLayout.layer_slices()``), concatenated in order. Design and derivations:
docs/plgu.md.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from pfl.optim.sharpness import perturbation

SAM_GRADIENTS = ("paper", "surrogate")  # the gradient hn_sam_server_update applies at φ + ε


def layer_sizes(layers: Mapping[str, slice] | Sequence[slice]) -> list[int]:
    """Sizes of layers that tile [0, P) in order (e.g. ``ModelLayout.layer_slices()``), checked so
    that the hypernetwork's concatenated heads are exactly the flat parameter vector."""
    slices = list(layers.values()) if isinstance(layers, Mapping) else list(layers)
    start = 0
    for sl in slices:
        if sl.start != start or sl.stop <= sl.start or sl.step not in (None, 1):
            raise ValueError(f"layers must be contiguous, non-empty and in order from 0; {sl} follows {start}")
        start = sl.stop
    return [sl.stop - sl.start for sl in slices]


def _linear(fan_in: int, fan_out: int, generator: torch.Generator) -> nn.Linear:
    """nn.Linear with PyTorch's default init U(±1/√fan_in) drawn from ``generator`` (built on the
    meta device first, so the global RNG is never touched)."""
    lin = nn.Linear(fan_in, fan_out, device="meta")
    bound = 1.0 / math.sqrt(fan_in)
    lin.weight = nn.Parameter(torch.empty(fan_out, fan_in).uniform_(-bound, bound, generator=generator))
    lin.bias = nn.Parameter(torch.empty(fan_out).uniform_(-bound, bound, generator=generator))
    return lin


class HyperNetwork(nn.Module):
    """w_i = h(v_i; φ): embedding → MLP trunk → output heads, one flat target vector per client.

    - ``embeddings`` (num_clients × embed_dim), N(0, 1) like nn.Embedding: the client descriptors v_i.
      ``embed_dim=None`` takes pFedHN's rule 1 + num_clients/4.
    - trunk: ``n_hidden`` fully connected layers of width ``hidden`` with ReLU between them and none
      after the last (the PLGU paper's "5 hidden layers of 100 units"; pFedHN's code counts only the
      hidden→hidden layers, so its ``--n-hidden k`` is ``n_hidden = k + 1`` here).
    - a target layer of size S ≤ ``chunk`` (every layer when ``chunk=None``) gets its own linear
      head hidden → S, as pFedHN's one head per layer. The dedicated heads are stored as the rows of
      one ``head`` matrix (hidden → Σ S): the same maps, one matmul.
    - a layer with S > ``chunk`` is emitted in ⌈S/chunk⌉ chunks by one chunk generator shared by all
      such layers (von Oswald et al., 2020): chunk k of layer l is
      W_out · ReLU(W_mix [f; c_{l,k}] + b_mix) + b_out, with f the trunk's output and c_{l,k} a
      learned chunk embedding (``chunk_embed_dim``); the last chunk is cut to size. The ReLU makes
      the client's share of each chunk depend on c_{l,k}; a linear map of [f; c] would give every
      chunk the same client-dependent part. Cost: hidden·chunk + (hidden + chunk_embed_dim + 1)·hidden
      + chunk + n_chunks·chunk_embed_dim parameters instead of (hidden + 1)·S per large layer.
      The default 2^17 leaves pFedHN's own CNN target (largest layer 96 120) exactly as pFedHN
      builds it, and caps a ResNet-18 at ~5× its size; chunk=16384 makes it ~0.45× (docs/plgu.md).

    φ is every parameter but ``embeddings`` (``phi_parameters()``). ``state_dict()`` holds tensors only.
    """

    def __init__(
        self,
        num_clients: int,
        target_sizes: Sequence[int],
        *,
        generator: torch.Generator,
        embed_dim: int | None = None,
        hidden: int = 100,
        n_hidden: int = 5,
        chunk: int | None = 1 << 17,
        chunk_embed_dim: int = 16,
    ):
        super().__init__()
        sizes = [int(s) for s in target_sizes]
        if num_clients < 1 or not sizes or min(sizes) < 1:
            raise ValueError(f"need >= 1 client and non-empty target layers, got {num_clients} and {sizes}")
        if hidden < 1 or n_hidden < 1 or (chunk is not None and chunk < 1) or chunk_embed_dim < 1:
            raise ValueError("hidden, n_hidden, chunk and chunk_embed_dim must be >= 1")
        self.num_clients, self.target_sizes, self.chunk = num_clients, sizes, chunk
        self.num_targets = sum(sizes)
        embed_dim = embed_dim if embed_dim is not None else int(1 + num_clients / 4)
        self.embeddings = nn.Parameter(torch.empty(num_clients, embed_dim).normal_(generator=generator))
        widths = [embed_dim] + [hidden] * n_hidden
        self.trunk = nn.ModuleList(_linear(a, b, generator) for a, b in zip(widths[:-1], widths[1:], strict=True))

        # Plan: layer by layer, either the next run of consecutive dedicated layers (one block of
        # the head's output) or the next chunked layer (⌈S/chunk⌉ rows of the chunk generator's).
        self._order: list[tuple[bool, int, int]] = []  # (chunked, index of the run/chunked layer, size)
        self._runs: list[int] = []  # sizes of the dedicated runs
        self._chunk_counts: list[int] = []  # chunks per chunked layer
        for s in sizes:
            if chunk is not None and s > chunk:
                self._order.append((True, len(self._chunk_counts), s))
                self._chunk_counts.append(-(-s // chunk))
            elif self._order and not self._order[-1][0]:
                self._runs[-1] += s
                self._order[-1] = (False, len(self._runs) - 1, self._runs[-1])
            else:
                self._order.append((False, len(self._runs), s))
                self._runs.append(s)
        dedicated, n_chunks = sum(self._runs), sum(self._chunk_counts)
        self.head = _linear(hidden, dedicated, generator) if dedicated else None
        if n_chunks:
            self.chunk_embeddings = nn.Parameter(torch.empty(n_chunks, chunk_embed_dim).normal_(generator=generator))
            self.chunk_mix = _linear(hidden + chunk_embed_dim, hidden, generator)
            self.chunk_head = _linear(hidden, chunk, generator)
        else:
            self.chunk_embeddings = self.chunk_mix = self.chunk_head = None

    @staticmethod
    def count_parameters(
        num_clients: int,
        target_sizes: Sequence[int],
        embed_dim: int | None = None,
        hidden: int = 100,
        n_hidden: int = 5,
        chunk: int | None = 1 << 17,
        chunk_embed_dim: int = 16,
    ) -> int:
        """How many parameters the hypernetwork would have, without building it (to check a
        configuration before allocating a head for a large target)."""
        e = embed_dim if embed_dim is not None else int(1 + num_clients / 4)
        total = num_clients * e + (e + 1) * hidden + (n_hidden - 1) * (hidden + 1) * hidden
        chunked = [s for s in target_sizes if chunk is not None and s > chunk]
        dedicated = sum(target_sizes) - sum(chunked)
        if dedicated:
            total += (hidden + 1) * dedicated
        if chunked:
            n_chunks = sum(-(-s // chunk) for s in chunked)
            total += n_chunks * chunk_embed_dim + (hidden + chunk_embed_dim + 1) * hidden + (hidden + 1) * chunk
        return total

    def phi_parameters(self) -> list[nn.Parameter]:
        """φ: every parameter except the client embeddings."""
        return [p for name, p in self.named_parameters() if name != "embeddings"]

    def param_groups(self, embed_lr: float | None = None) -> list[dict]:
        """Optimizer groups as in pFedHN's code: φ, then the embeddings with their own lr if given."""
        emb: dict = {"params": [self.embeddings]}
        if embed_lr is not None:
            emb["lr"] = embed_lr
        return [{"params": self.phi_parameters()}, emb]

    def features(self, v: Tensor) -> Tensor:
        for i, layer in enumerate(self.trunk):
            v = layer(v if i == 0 else F.relu(v))
        return v

    def forward(self, cid: int | Sequence[int] | Tensor) -> Tensor:
        """The flat target vector (P,) for one client id, or (B, P) for a 1-D batch of ids."""
        idx = torch.as_tensor(cid, dtype=torch.long, device=self.embeddings.device)
        single = idx.dim() == 0
        f = self.features(self.embeddings[idx.reshape(-1)])
        # torch.split, not slicing: the backward of a slice allocates a zero gradient the size of
        # the whole sliced tensor, once per layer; split's backward is one concatenation.
        runs = torch.split(self.head(f), self._runs, dim=1) if self.head is not None else ()
        chunked: Sequence[Tensor] = ()
        if self.chunk_head is not None:
            w_mix = self.chunk_mix.weight
            hidden = f.shape[1]
            # W_mix [f; c] split into its f and c columns: the same map without materialising the
            # concatenation for every (client, chunk) pair.
            per_chunk = F.linear(self.chunk_embeddings, w_mix[:, hidden:], self.chunk_mix.bias)
            mixed = F.relu(F.linear(f, w_mix[:, :hidden])[:, None, :] + per_chunk[None])
            chunked = torch.split(self.chunk_head(mixed), self._chunk_counts, dim=1)  # (B, n_l, chunk) each
        pieces = [chunked[j].flatten(1)[:, :size] if is_chunked else runs[j] for is_chunked, j, size in self._order]
        out = pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=1)
        return out[0] if single else out


def _batch(hn: HyperNetwork, cid: int | Sequence[int] | Tensor, delta_w: Tensor) -> tuple[Tensor, Tensor, int]:
    idx = torch.as_tensor(cid, dtype=torch.long, device=hn.embeddings.device)
    if idx.dim() > 1:
        raise ValueError(f"cid must be one id or a 1-D sequence of ids, got shape {tuple(idx.shape)}")
    expected = (hn.num_targets,) if idx.dim() == 0 else (idx.numel(), hn.num_targets)
    if tuple(delta_w.shape) != expected:
        raise ValueError(f"delta_w has shape {tuple(delta_w.shape)}, expected {expected}")
    if idx.numel() == 0 or int(idx.min()) < 0 or int(idx.max()) >= hn.num_clients:
        raise ValueError(f"client ids must be in [0, {hn.num_clients}), got {idx.tolist()}")
    return idx, delta_w.detach().to(hn.embeddings.dtype), idx.numel() if idx.dim() == 1 else 1


def _inputs(hn: HyperNetwork) -> list[nn.Parameter]:
    return [*hn.phi_parameters(), hn.embeddings]


def _apply(
    hn: HyperNetwork, optimizer: torch.optim.Optimizer, grads: Sequence[Tensor | None], batch: int, clip: float | None
) -> None:
    """Install the surrogate gradient and step: φ gets the mean over the batch's clients (PLGU
    Eq. 24's 1/|C|), each embedding row its own client's full gradient (Eq. 25)."""
    params = _inputs(hn)
    for i, (p, g) in enumerate(zip(params, grads, strict=True)):
        g = torch.zeros_like(p) if g is None else g
        if batch > 1 and i < len(params) - 1:
            g = g / batch
        p.grad = g
    if clip is not None:
        torch.nn.utils.clip_grad_norm_(params, clip)
    optimizer.step()


def hn_server_update(
    hn: HyperNetwork,
    optimizer: torch.optim.Optimizer,
    cid: int | Sequence[int] | Tensor,
    delta_w: Tensor,
    max_grad_norm: float | None = None,
) -> None:
    """pFedHN's server step for client(s) ``cid`` that trained w_i = h(v_i; φ) into w_i + Δw_i.

    Gradient (∂w_i/∂(φ, v_i))ᵀ (w_i − (w_i + Δw_i)) = (∂w_i/∂(φ, v_i))ᵀ(−Δw_i), i.e. pFedHN's
    ``autograd.grad(w_i, params, grad_outputs=w_i − w_trained)``: the gradient of the surrogate
    ½‖h(v_i; φ) − (w_i + Δw_i)‖², so a descent step moves w_i toward the trained weights.
    Then ``optimizer.step()`` (set up with ``hn.param_groups()`` or ``hn.parameters()``).

    One id with Δw of shape (P,) is pFedHN's per-client step. A batch of ids with Δw of shape
    (B, P) averages the φ gradient over the clients and gives each embedding its own client's
    gradient. The Jacobian is taken at the current φ. ``max_grad_norm`` clips the gradient norm
    over all hypernetwork parameters before the step (pFedHN's code: 50; the paper: none).
    """
    idx, delta, batch = _batch(hn, cid, delta_w)
    w = hn(idx)
    grads = torch.autograd.grad(w, _inputs(hn), grad_outputs=-delta, allow_unused=True)
    _apply(hn, optimizer, grads, batch, max_grad_norm)


def hn_sam_server_update(
    hn: HyperNetwork,
    optimizer: torch.optim.Optimizer,
    cid: int | Sequence[int] | Tensor,
    delta_w: Tensor,
    rho: float,
    p: float = 2.0,
    max_grad_norm: float | None = None,
    gradient: str = "paper",
) -> None:
    """PLGU-GHN's server step (PLGU supplementary C, Eqs. 24–25): ``hn_server_update`` with the
    gradient taken at the sharpness-perturbed hypernetwork weights φ + ε.

    1. g = (1/B) Σ_i (∂w_i/∂φ)ᵀ(−Δw_i), the surrogate's φ-gradient at φ;
    2. ε = ``perturbation(g, rho, p)`` over the concatenated φ (p = 2: ε = ρ g/‖g‖). Only φ is
       perturbed, not the embeddings: Eq. 24 defines φ̃ = φ + ε, and Eq. 25 updates v_i "through
       the perturbed φ";
    3. the gradient at φ + ε for φ and every v_i, by ``gradient``:
       - "paper" (Eq. 24, ∇_{φ+ε}(w_i)ᵀΔw_i): the Jacobian at φ + ε applied to the clients' own
         update, (∂w_i/∂φ at φ + ε)ᵀ(−Δw_i). Δw_i stands for the clients' loss gradient at w_i; no
         client re-evaluates its loss at h(v_i; φ + ε), so the perturbation acts through the
         Jacobian only, as SAM's gradient at the perturbed point of the loss Σ_i F_i(h(v_i; φ));
       - "surrogate": the gradient of pFedHN's surrogate ½‖h(v_i; φ + ε) − (w_i + Δw_i)‖² at
         φ + ε with the targets fixed, i.e. the output gradient (h(v_i; φ + ε) − w_i) − Δw_i. It
         adds (∂w_i/∂φ at φ + ε)ᵀ(h(v_i; φ + ε) − w_i), a pull back against the perturbation itself.
         On a large target (the benchmark's 1.66 M-parameter CNN) |h(φ + ε) − h(φ)| is already
         comparable to |Δw_i| in the first round (3.0 vs 4.9) and the steps grew from round to round
         until the clients' models diverged (round 4), where "paper" trains as pFedHN does
         (docs/plgu.md);
    4. φ restored by copy, the step-3 gradient applied by ``optimizer`` (clipped as in
       ``hn_server_update``).

    The paper prints g = ∇_φ(w_i)ᵀΔw_i, with Δw_i = trained − w_i; descending that moves w_i away
    from the trained weights. The sign here is pFedHN's (grad_outputs = w_i − trained), under which
    ε is the ascent direction of the surrogate loss, as SAM needs. ρ = 0 gives ``hn_server_update``.
    """
    if rho < 0:
        raise ValueError(f"rho must be >= 0, got {rho}")
    if gradient not in SAM_GRADIENTS:
        raise ValueError(f"gradient must be one of {SAM_GRADIENTS}, got {gradient!r}")
    idx, delta, batch = _batch(hn, cid, delta_w)
    phi = hn.phi_parameters()
    w = hn(idx)
    g_phi = torch.autograd.grad(w, phi, grad_outputs=-delta, allow_unused=True)
    w_ref = w.detach()
    del w
    with torch.no_grad():
        # ε depends on g's direction only, so Eq. 24's 1/|C| needs no division here.
        flat_g = torch.cat(
            [(torch.zeros_like(t) if g is None else g).reshape(-1) for t, g in zip(phi, g_phi, strict=True)]
        )
        eps = perturbation(flat_g, rho, p)
        del flat_g
        backup = [t.detach().clone() for t in phi]
        offset = 0
        for t in phi:
            t.add_(eps[offset : offset + t.numel()].view_as(t))
            offset += t.numel()
        del eps
    try:
        w_tilde = hn(idx)
        out_grad = -delta if gradient == "paper" else (w_tilde.detach() - w_ref) - delta
        grads = torch.autograd.grad(w_tilde, _inputs(hn), grad_outputs=out_grad, allow_unused=True)
    finally:
        with torch.no_grad():
            for t, b in zip(phi, backup, strict=True):
                t.copy_(b)
    _apply(hn, optimizer, grads, batch, max_grad_norm)
