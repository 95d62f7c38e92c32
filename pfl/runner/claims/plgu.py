"""PLGU (CVPR'23): the poor clients gain without the best ones losing (Tables 1–2), on MNIST-5k Pat-3 with
100 clients, 10 sampled per round (conf/experiment/plgu_mnist5k_pat3_c100.yaml; each client is tested on
~420 held-out samples of its classes, so the top-5% accuracy is not pinned at 1.0)."""

from __future__ import annotations

from collections.abc import Callable

from pfl.runner.claims import Claim, Contrast, LrGrid, SeedSummaries, method_args, paired, seed_mean

# 10% of each client's training samples are its validation set, on which each run's learning rate is chosen
# from {0.01, 0.05, 0.1} (the configured 0.05 in the middle) in runs of 60 of the 150 rounds.
PLGU_BASE = ["--config", "conf/experiment/plgu_mnist5k_pat3_c100.yaml", "--tracking.wandb", "false",
             "--data.val_frac", "0.1"]  # fmt: skip
PLGU_GRID = LrGrid((0.01, 0.05, 0.1), rounds=60)
RHO = 0.05  # the paper's rho for FedSAM and the PLGU variants (method configs)
MLP_LAYERS = 3  # the analogue's MLP 784-128-128-10
TOP_MARGIN = 0.02  # top-5% accuracy may drop by at most 2 points ("without degrading the top clients")
# FedRep and PLGU-GRep: K = 5 head epochs and one body epoch (the paper's FedRep setting, D.2).
REP = ["--method.head_epochs", "5", "--client.epochs", "1"]
# LWSAM's perturbation is rho * xi_l * g_l / ||g|| per layer with sum_l xi_l = 1, so its radius lies between
# rho * min xi and rho * max xi; with equal scores it is rho / L. FedSAM at that rho is the matched control.
RHO_MATCHED = RHO / MLP_LAYERS


def _runs() -> dict[str, list[str]]:
    runs = {m: method_args(m, "--config", f"conf/method/{m}.yaml") for m in ("fedavg", "fedsam", "ditto", "pfedme")}
    runs["fedsam_matched"] = method_args(
        "fedsam", "--config", "conf/method/fedsam.yaml", "--method.rho", f"{RHO_MATCHED:.6g}"
    )
    runs["fedrep"] = method_args("fedrep", "--config", "conf/method/fedrep.yaml", *REP)
    runs["pfedhn"] = method_args("pfedhn", "--config", "conf/method/pfedhn.yaml")
    # The analogue's MLP has 3 layers: D = 1 of them personal (the paper: 5 of ResNet-18's 41).
    runs["plgu_lf"] = method_args("plgu_lf", "--config", "conf/method/plgu_lf.yaml", "--method.personal_layers", "1")
    grep = method_args("plgu_grep", "--config", "conf/method/plgu_grep.yaml", *REP)
    runs["plgu_grep"] = [*grep, "--method.pre_step", "false"]  # Algorithm 3's step count
    runs["plgu_grep_rho0"] = [*grep, "--method.pre_step", "false", "--method.rho", "0"]  # control: no LWSAM
    runs["plgu_grep_pre"] = [*grep, "--method.pre_step", "true"]  # the extra SGD step per body batch (an option)
    runs["plgu_ghn"] = method_args("plgu_ghn", "--config", "conf/method/plgu_ghn.yaml")
    return runs


# (run, baseline, model), what the paper's tables compare: Table 1, PLGU-LF's global model against FedAvg's,
# FedSAM's (at the nominal and at the matched rho), Ditto's and pFedMe's; Table 2, the personalized models of
# PLGU-LF, PLGU-GRep and PLGU-GHN against Ditto's, pFedMe's, FedRep's and pFedHN's.
PAIRS = (
    *(("plgu_lf", base, "gm") for base in ("fedavg", "fedsam", "fedsam_matched", "ditto", "pfedme")),
    *(
        (run, base, "pm")
        for run in ("plgu_grep", "plgu_ghn", "plgu_lf")
        for base in ("fedrep", "pfedhn", "ditto", "pfedme")
    ),
)


def tails_contrasts(margin: float = TOP_MARGIN) -> Callable[[SeedSummaries], list[Contrast]]:
    """Per pair: the run's bottom-5% accuracy minus the baseline's (> 0), and its top-5% minus the
    baseline's (> -margin); and PLGU-GRep's bottom-5% minus its rho = 0 control's (> 0: the gain is LWSAM's)."""

    def contrasts(s: SeedSummaries) -> list[Contrast]:
        out = []
        for run, base, model in PAIRS:
            low, top = f"{model}.l_acc.bottom5", f"{model}.l_acc.top5"
            out.append(Contrast(f"{run} - {base} ({low})", paired(s, run, base, low)))
            out.append(Contrast(f"{run} - {base} ({top})", paired(s, run, base, top), -margin))
        key = "pm.l_acc.bottom5"
        out.append(Contrast(f"plgu_grep - plgu_grep_rho0 ({key})", paired(s, "plgu_grep", "plgu_grep_rho0", key)))
        return out

    return contrasts


def diagnose(s: SeedSummaries) -> list[str]:
    """Measured, over the seeds: each pair's bottom-5% and top-5% means, and whether PLGU-GRep's bottom-5%
    change over FedRep survives rho = 0 and comes with the extra SGD step."""
    lines = []
    for run, base, model in PAIRS:
        low, top = f"{model}.l_acc.bottom5", f"{model}.l_acc.top5"
        vals = [seed_mean(s, run, low), seed_mean(s, base, low), seed_mean(s, run, top), seed_mean(s, base, top)]
        if None not in vals:
            lines.append(
                f"{run} vs {base} ({model}): bottom-5% {vals[0]:.4f} vs {vals[1]:.4f}, top-5% {vals[2]:.4f} vs "
                f"{vals[3]:.4f}."
            )
    low = "pm.l_acc.bottom5"
    grep = {lab: seed_mean(s, lab, low) for lab in ("fedrep", "plgu_grep", "plgu_grep_rho0", "plgu_grep_pre")}
    if None not in grep.values():
        lines.append(
            f"PLGU-GRep's bottom-5% change over FedRep: {grep['plgu_grep'] - grep['fedrep']:+.4f} with LWSAM, "
            f"{grep['plgu_grep_rho0'] - grep['fedrep']:+.4f} at rho = 0, "
            f"{grep['plgu_grep_pre'] - grep['fedrep']:+.4f} with the extra SGD step per body batch."
        )
    return lines


CLAIMS = [
    Claim(
        key="plgu_tails",
        paper="PLGU (CVPR'23), Tables 1-2",
        statement="PLGU raises the bottom-5% client accuracy without lowering the top-5% by more than 2 points: "
        "PLGU-LF's global model against FedAvg, FedSAM (at the paper's rho and at LWSAM's effective radius rho/L), "
        "Ditto and pFedMe (Table 1), the personalized models of PLGU-LF, PLGU-GRep and PLGU-GHN against Ditto, "
        "pFedMe, FedRep and pFedHN (Table 2); PLGU-GRep's gain comes from LWSAM (its rho = 0 control is lower) "
        "(Pat-3 label skew, 100 clients, 10 sampled per round, K = 5, rho = 0.05)",
        base=PLGU_BASE,
        runs=_runs(),
        contrasts=tails_contrasts(),
        winner="plgu_grep",
        diagnose=diagnose,
        metrics=("pm.l_acc", "pm.l_acc.top5", "pm.l_acc.bottom5", "gm.l_acc", "gm.l_acc.top5", "gm.l_acc.bottom5"),
        lr_grid=PLGU_GRID,
    ),
]
