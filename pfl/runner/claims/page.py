"""PAGE (WWW'24): Table 1's claim that PAGE has the highest global and local accuracy at once."""

from __future__ import annotations

from collections.abc import Callable

from pfl.runner.claims import Claim, Contrast, SeedSummaries, method_args, paired

# The embedded Synthetic analogue (100 clients, 60 rounds, 5 local epochs): about 2 minutes per baseline
# and 4 for PAGE on 2 CPU cores.
PAGE_BASE = ["--config", "conf/experiment/page_embedded_synthetic.yaml", "--tracking.wandb", "false"]
PAGE_BASELINES = ["fedavg", "fedprox", "scaffold", "feddyn", "ditto", "fedala", "fedrod"]
GLOBAL_BASELINES = [b for b in PAGE_BASELINES if b not in ("scaffold", "feddyn")]


def page_contrasts(winner: str = "page") -> Callable[[SeedSummaries], list[Contrast]]:
    """Table 1: ``winner``'s personalized accuracy above every baseline's, its global accuracy above the
    baselines' except SCAFFOLD and FedDyn (the paper reports those higher on Synthetic)."""

    def contrasts(s: SeedSummaries) -> list[Contrast]:
        out = [Contrast(f"{winner} - {b} (pm.l_acc)", paired(s, winner, b, "pm.l_acc.mean")) for b in PAGE_BASELINES]
        out += [Contrast(f"{winner} - {b} (gm.acc)", paired(s, winner, b, "gm.acc")) for b in GLOBAL_BASELINES]
        return out

    return contrasts


CLAIMS = [
    Claim(
        key="page_table1_synthetic",
        paper="PAGE (WWW'24), Tables 1-2",
        statement="PAGE reaches the highest global accuracy (global model on the server's test set) and the highest "
        "mean local accuracy (each client's trained model on its own test split) at once, against FedAvg, FedProx, "
        "SCAFFOLD, FedDyn, Ditto, FedALA and FedRoD, on Synthetic (100 clients, all taking part every round)",
        base=PAGE_BASE,
        runs={
            **{m: method_args(m, "--config", f"conf/method/{m}.yaml") for m in PAGE_BASELINES},
            "page": method_args("page", "--config", "conf/method/page_short.yaml"),
        },
        contrasts=page_contrasts(),
        winner="page",
        metrics=("gm.acc", "pm.l_acc", "rounds_to_target", "time.page.agents_over_fl"),
    ),
]
