"""PLGU (CVPR'23): the poor clients gain without the best ones losing (Tables 1–2), on the embedded
digits Pat-3 analogue (conf/experiment/plgu_digits_pat3.yaml)."""

from __future__ import annotations

from collections.abc import Callable

from pfl.runner.claims import Claim, Contrast, SeedSummaries, method_args, paired

# 60 of the config's 100 rounds keep the nine runs near half an hour on 2 CPU cores.
PLGU_BASE = [
    "--config",
    "conf/experiment/plgu_digits_pat3.yaml",
    "--trainer.rounds",
    "60",
    "--tracking.wandb",
    "false",
]
TOP_MARGIN = 0.02  # top-5% accuracy may drop by at most 2 points ("without degrading the top clients")
# FedRep and PLGU-GRep: K = 5 head epochs and one body epoch (the paper's FedRep setting, D.2).
REP = ["--method.head_epochs", "5", "--client.epochs", "1"]


def _runs() -> dict[str, list[str]]:
    runs = {m: method_args(m, "--config", f"conf/method/{m}.yaml") for m in ("fedavg", "fedsam", "ditto", "pfedme")}
    runs["fedrep"] = method_args("fedrep", "--config", "conf/method/fedrep.yaml", *REP)
    runs["pfedhn"] = method_args("pfedhn", "--config", "conf/method/pfedhn.yaml")
    # The analogue's CNN has 4 layers: D = 1 of them personal (the paper: 5 of ResNet-18's 41).
    runs["plgu_lf"] = method_args("plgu_lf", "--config", "conf/method/plgu_lf.yaml", "--method.personal_layers", "1")
    runs["plgu_grep"] = method_args("plgu_grep", "--config", "conf/method/plgu_grep.yaml", *REP)
    runs["plgu_ghn"] = method_args("plgu_ghn", "--config", "conf/method/plgu_ghn.yaml")
    return runs


def tails_contrasts(margin: float = TOP_MARGIN) -> Callable[[SeedSummaries], list[Contrast]]:
    """PLGU-LF's global model has a higher bottom-5% accuracy than FedAvg's and FedSAM's (Table 1),
    PLGU-GRep's personalized models a higher one than FedRep's (Table 2), and in both cases the
    top-5% accuracy is at most ``margin`` below each baseline's."""

    def contrasts(s: SeedSummaries) -> list[Contrast]:
        out = []
        for run, baselines, model in (("plgu_lf", ("fedavg", "fedsam"), "gm"), ("plgu_grep", ("fedrep",), "pm")):
            for base in baselines:
                low, top = f"{model}.l_acc.bottom5", f"{model}.l_acc.top5"
                out.append(Contrast(f"{run} - {base} ({low})", paired(s, run, base, low)))
                out.append(Contrast(f"{run} - {base} ({top}), may drop {margin}", paired(s, run, base, top), -margin))
        return out

    return contrasts


CLAIMS = [
    Claim(
        key="plgu_tails",
        paper="PLGU (CVPR'23), Tables 1-2",
        statement="PLGU raises the bottom-5% client accuracy without lowering the top-5% by more than 2 points: "
        "PLGU-LF's global model against FedAvg and FedSAM, PLGU-GRep's personalized models against FedRep "
        "(Pat-3 label skew, 10 clients sampled per round, K = 5, rho = 0.05)",
        base=PLGU_BASE,
        runs=_runs(),
        contrasts=tails_contrasts(),
        winner="plgu_grep",
        metrics=("pm.l_acc", "pm.l_acc.top5", "pm.l_acc.bottom5", "gm.l_acc", "gm.l_acc.top5", "gm.l_acc.bottom5"),
    ),
]
