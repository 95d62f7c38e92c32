"""FedORA (KDD'23): positive transfer for (almost) every client, balanced and with one big client."""

from __future__ import annotations

from collections.abc import Callable

from pfl.runner.claims import Claim, Contrast, SeedSummaries, above, method_args, paired

# 50 rounds on the embedded rotated MNIST-5k analogue (36 clients in 4 rotation groups); PTR and R-Acc
# come from the suite's own `local` run on the same split and seed.
FEDORA_BALANCED = ["--config", "conf/experiment/fedora_rotated_mnist5k.yaml"]
FEDORA_BIG = ["--config", "conf/experiment/fedora_rotated_mnist5k_big.yaml"]
COMMON = ["--trainer.rounds", "50", "--eval.reference", "none", "--tracking.wandb", "false"]

# The methods of the paper's Tables 1 and 3 that pfl has (pFedHN is not implemented).
FEDORA_RUNS = {
    "local": method_args("local"),
    "fedavg": method_args("fedavg", "--config", "conf/method/fedavg.yaml"),
    "fedavg_ft": method_args("fedavg", "--config", "conf/method/fedavg.yaml", "--method.finetune_epochs", "1"),
    "fedprox_ft": method_args("fedprox", "--config", "conf/method/fedprox.yaml", "--method.finetune_epochs", "1"),
    **{
        m: method_args(m, "--config", f"conf/method/{m}.yaml")
        for m in ("lgfedavg", "fedper", "apfl", "ditto", "ifca", "fesem", "fedfomo", "fedu", "fedamp", "fedora")
    },
    "fedora_official": method_args("fedora", "--config", "conf/method/fedora_official.yaml"),
}
FEDORA_VARIANTS = ("fedora", "fedora_official")
LOW_PTR = 0.5  # "FedAvg's PTR is low": at most half of the clients gain over LOCAL
HIGH_PTR = 0.9


def fedora_ptr_contrasts(winner: str = "fedora") -> Callable[[SeedSummaries], list[Contrast]]:
    """``winner``'s PTR against every baseline's (FedORA variants and LOCAL excluded), ``winner``'s PTR
    above 0.9, and FedAvg's PTR at most 0.5."""

    def contrasts(s: SeedSummaries) -> list[Contrast]:
        labels = {label for runs in s.values() for label in runs}
        baselines = sorted(labels - {*FEDORA_VARIANTS, "local"})
        out = [Contrast(f"{winner} - {b} (PTR)", paired(s, winner, b, "ptr")) for b in baselines]
        out.append(Contrast(f"{winner} PTR - {HIGH_PTR}", above(s, winner, "ptr", HIGH_PTR)))
        low = {seed: -d for seed, d in above(s, "fedavg", "ptr", LOW_PTR).items()}
        out.append(Contrast(f"{LOW_PTR} - fedavg PTR", low))
        return out

    return contrasts


CLAIMS = [
    Claim(
        key="fedora_rotated",
        paper="FedORA (KDD'23), Table 1",
        statement="On rotated MNIST (feature shift, 36 clients) FedORA has the highest positive transferability "
        "ratio (PTR >= 0.9: almost every client is at least as accurate as when training alone) while FedAvg's PTR "
        "is low",
        base=[*FEDORA_BALANCED, *COMMON],
        runs=FEDORA_RUNS,
        contrasts=fedora_ptr_contrasts(),
        winner="fedora",
    ),
    Claim(
        key="fedora_rotated_big",
        paper="FedORA (KDD'23), Table 3",
        statement="With one client holding far more data than the others, FedORA still has the highest PTR "
        "(>= 0.9) while FedAvg's PTR is low",
        base=[*FEDORA_BIG, *COMMON],
        runs=FEDORA_RUNS,
        contrasts=fedora_ptr_contrasts(),
        winner="fedora",
    ),
]
