"""FedORA's two graphs on a rotation-group federation: ``python -m bench.fedora_graphs [fit args]``.

Runs FedORA with the given ``python -m pfl fit`` arguments (without a ``--config``: the rotated MNIST-5k
analogue with the paper's configuration, then the given overrides) and prints one JSON line with what
decides whether propagation helps:

- ``w_within`` / ``w_between``: mean off-diagonal principal-angle similarity (Eq. 4) of two clients in
  the same rotation group (client k is in group k mod G) and in different groups;
- ``other_group_weight``: the mean over clients of Σ_{k' in another group} M[k, k'], the share of other
  groups' parameters in the propagated model θ̂_k = Σ_k' M[k, k'] θ_k' (needs ``propagation: closed``);
- ``lambda_mean`` / ``lambda_above_eps``: λ_k of the last round (mean, and share of clients with
  λ_k > ε, i.e. that do not fall back to LOCAL);
- the reported round's ``pm.l_acc.mean`` and ``ptr`` (share of clients at least as good as LOCAL).

Examples (docs/fedora.md, "The paper's graph and the code's, measured"):
  python -m bench.fedora_graphs
  python -m bench.fedora_graphs --method.similarity official
  python -m bench.fedora_graphs --config conf/experiment/fedora_rotated_mnist5k.yaml \
      --config conf/method/fedora_official.yaml
"""

from __future__ import annotations

import json
import sys

import torch

from pfl.data import build_data
from pfl.optim.propagation import principal_angle_similarity
from pfl.runner.args import parse_fit_args
from pfl.runner.assembly import build_loop
from pfl.runner.plan import plan_run
from pfl.runner.reference import ensure_local_reference

DEFAULT = ["--config", "conf/experiment/fedora_rotated_mnist5k.yaml", "--config", "conf/method/fedora.yaml"]


def group_means(w: torch.Tensor, groups: int) -> tuple[float, float]:
    """Mean off-diagonal entry of ``w`` within a group and between groups (group of k: k mod groups)."""
    g = torch.arange(w.shape[0]) % groups
    same = g[:, None] == g[None, :]
    off = ~torch.eye(w.shape[0], dtype=torch.bool)
    return float(w[same & off].mean()), float(w[~same].mean())


def other_group_weight(m: torch.Tensor, groups: int) -> float:
    """Mean over rows of the weight M puts on clients of other groups."""
    g = torch.arange(m.shape[0]) % groups
    return float((m * (g[:, None] != g[None, :])).sum(dim=1).mean())


def main(argv: list[str]) -> dict[str, float]:
    argv = argv if "--config" in argv else DEFAULT + argv
    cfg = parse_fit_args(argv + ["--trainer.progress", "false"])[0]
    groups = cfg.data.rotation_groups
    if groups < 2:
        raise SystemExit("bench.fedora_graphs needs data.rotation_groups >= 2")
    data = build_data(cfg.data, cfg.seed)
    loop = build_loop(plan_run(cfg, data), reference=ensure_local_reference(cfg, data, None))
    method, lams = loop.method, {}
    real = method.selective_lambda

    def recording(client, own, hat):
        lam = real(client, own, hat)
        lams[client.cid] = lam
        return lam

    method.selective_lambda = recording
    summary = loop.fit()
    server = loop.server
    within, between = group_means(principal_angle_similarity(server["bases"]), groups)
    lam = torch.tensor([lams[c] for c in sorted(lams)], dtype=torch.float64)
    out = {
        "similarity": method.similarity,
        "w_within": within,
        "w_between": between,
        "other_group_weight": other_group_weight(server["M"], groups),
        "lambda_mean": float(lam.mean()),
        "lambda_above_eps": float((lam > method.eps).double().mean()),
        "pm.l_acc.mean": summary["metrics"]["pm.l_acc.mean"],
        "ptr": summary["metrics"]["ptr"],
    }
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main(sys.argv[1:])
