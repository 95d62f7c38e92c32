"""PGFed (ICCV'23): Table 2's personalized accuracy, PGFed against every baseline of the table pfl has,
paired per seed."""

from __future__ import annotations

from pfl.runner.claims import Claim, beats, method_args, standing

# 25 of the config's 100 rounds, for the suite's 4-hour budget: one seed of the 17 runs costs ~46
# CPU-minutes, pFedMe 12 of them (docs/reproduce.md, Budget).
PGFED_BASE = [
    "--config",
    "conf/experiment/pgfed_mnist5k_dir03.yaml",
    "--trainer.rounds",
    "25",
    "--tracking.wandb",
    "false",
]
BASELINES = ["local", "fedavg", "fedprox", "ditto", "apfl", "pfedme", "perfedavg", "fedrep", "fedper",
             "lgfedavg", "fedrod", "fedbabu", "fedfomo", "feddyn"]  # fmt: skip
VARIANTS = ["pgfed", "pgfedmo", "pgfed_ce"]  # PGFed, its momentum variant, and cross-entropy as the risk

CLAIMS = [
    Claim(
        key="pgfed_table",
        paper="PGFed (ICCV'23), Table 2",
        statement="PGFed reaches a higher mean personalized accuracy than every baseline under Dirichlet(0.3) "
        "label skew (25 clients, 25% sampled, 5 local epochs)",
        base=PGFED_BASE,
        runs={m: method_args(m, "--config", f"conf/method/{m}.yaml") for m in [*BASELINES, *VARIANTS]},
        contrasts=beats("pgfed", BASELINES, "pm.l_acc.mean"),
        diagnose=standing("pgfed", "pm.l_acc.mean"),
        winner="pgfed",
    ),
]
