"""FedPG ("Preserving Global Performance in Personalized FL", paper 000): Tables 1 and 3 on the embedded
digits Pat-2 analogue (conf/experiment/fedpg_digits_pat2.yaml: 20 clients, 10 online per round, 100 rounds)."""

from __future__ import annotations

import csv
from pathlib import Path

from pfl.federation.attacks import malicious_clients
from pfl.runner.claims import Claim, Summaries, method_args

FEDPG_BASE = [
    "--config",
    "conf/experiment/fedpg_digits_pat2.yaml",
    "--tracking.wandb",
    "false",
]
BASELINES = ["fedavg", "ditto", "fedrep"]  # the rows Table 1's statement is about
# label -> (method, its config under conf/method/); fedpg/sfedpg and the gamma rows use the authors' rescaled Q,
# fedpg_paper the Q as the paper writes it (it stalls: docs/fedpg.md)
TABLE1 = {
    **{m: (m, m) for m in ("local", "fedavg", "fedprox", "ditto", "fedrep", "fedmgda_plus", "splitgp")},
    "fedpg": ("fedpg", "fedpg_official"),
    "fedpg_paper": ("fedpg", "fedpg"),
    "sfedpg": ("sfedpg", "sfedpg_official"),
    "fedpg_g03": ("fedpg", "fedpg_gamma03"),
    "fedpg_g06": ("fedpg", "fedpg_gamma06"),
    "fedpg_g10": ("fedpg", "fedpg_gamma10"),
}
ATTACKED = [k for k in TABLE1 if k not in ("local", "fedpg_paper")]  # LOCAL uploads nothing: nothing to attack
RETAIN_FEDPG = 0.95  # FedPG's P-models keep at least this share of their L-acc on the S- and G-tests
RETAIN_GAP = 0.10  # ... and every baseline keeps at least this much less (on the G-test)
STABLE = 0.05  # FedPG's honest accuracies under attack stay within this of its clean run
ATTACK_FRACTION = 0.1  # conf/experiment/fedpg_attack_a1.yaml and a2.yaml


def _runs(label: str, attack: str | None = None) -> list[str]:
    method, config = TABLE1[label]
    args = method_args(method, "--config", f"conf/method/{config}.yaml")
    if attack is not None:
        args += ["--config", f"conf/experiment/fedpg_attack_{attack}.yaml"]
    return args


def _get(s: Summaries, label: str, key: str) -> float:
    return s[label]["metrics"][key]


def check_table1(s: Summaries) -> tuple[bool, str]:
    def retain(label: str, test: str) -> float:
        return _get(s, label, f"pm.{test}_acc.mean") / _get(s, label, "pm.l_acc.mean")

    fedpg = min(retain("fedpg", "s"), retain("fedpg", "g"))
    others = {b: retain(b, "g") for b in BASELINES}
    held = fedpg >= RETAIN_FEDPG and all(v <= retain("fedpg", "g") - RETAIN_GAP for v in others.values())
    most = ", ".join(f"{b} {v:.2f}" for b, v in others.items())
    return held, (
        f"FedPG P-models keep {retain('fedpg', 's'):.2f} (S) and {retain('fedpg', 'g'):.2f} (G) of their L-acc; "
        f"G/L of {most} (the paper's FMNIST: FedPG 0.99, FedAvg 0.37, Ditto 0.39, FedRep 0.52)"
    )


def honest_clean(summary: dict, key: str) -> float:
    """Mean of a per-client key over the clients the attacks make malicious, from a clean run's
    clients.csv (the attacked runs draw the same clients: same seed, same fraction)."""
    bad = set(malicious_clients(summary["seed"], summary["num_clients"], ATTACK_FRACTION).tolist())
    with open(Path(summary["run_dir"]) / "clients.csv") as fh:
        values = [float(r[key]) for r in csv.DictReader(fh) if int(r["client"]) not in bad]
    return sum(values) / len(values)


def check_table3(s: Summaries) -> tuple[bool, str]:
    keys = ("honest.pm.s_acc.mean", "honest.pm.g_acc.mean", "gm.acc")
    clean = {
        k: honest_clean(s["fedpg_clean"], k[7:-5]) if k.startswith("honest.") else _get(s, "fedpg_clean", k)
        for k in keys
    }
    drops = {a: max(clean[k] - _get(s, f"fedpg_{a}", k) for k in keys) for a in ("a1", "a2")}
    best = {}
    for a in ("a1", "a2"):
        scores = {lab: _get(s, f"{lab}_{a}", "honest.pm.g_acc.mean") for lab in ATTACKED}
        best[a] = max(scores, key=scores.__getitem__)
    held = all(d <= STABLE for d in drops.values()) and all(b.startswith(("fedpg", "sfedpg")) for b in best.values())
    return held, (
        f"FedPG's largest honest drop from clean (S-acc, G-acc, G-model): A1 {drops['a1']:.3f}, A2 {drops['a2']:.3f}; "
        f"best honest G-acc under A1: {best['a1']}, under A2: {best['a2']}"
    )


TABLE1_RUNS = {label: _runs(label) for label in TABLE1}
TABLE3_RUNS = {"fedpg_clean": _runs("fedpg")}
TABLE3_RUNS.update({f"{label}_{a}": _runs(label, a) for a in ("a1", "a2") for label in ATTACKED})

CLAIMS = [
    Claim(
        key="fedpg_table1",
        paper="FedPG (paper 000), Table 1",
        statement=f"FedPG's P-models keep their S-acc and G-acc close to their L-acc (>= {RETAIN_FEDPG} of it), while "
        f"the P-models of FedAvg (locally trained model, eval.pm_source local_update), Ditto and FedRep keep at least "
        f"{RETAIN_GAP} less of it on the G-test (Pat-2, 20 clients, 10 online per round)",
        base=FEDPG_BASE,
        runs=TABLE1_RUNS,
        check=check_table1,
        winner="fedpg",
        metrics=("pm.l_acc", "pm.s_acc", "pm.g_acc", "gm.acc", "conflict.fraction", "gain", "ptr"),
    ),
    Claim(
        key="fedpg_table3",
        paper="FedPG (paper 000), Table 3",
        statement=f"under attacks A1 (Gaussian uploads) and A2 (100x scaled updates) from 10% of the clients, FedPG's "
        f"honest clients keep their clean S-acc, G-acc and G-model accuracy (within {STABLE}) and FedPG has the best "
        f"honest G-acc of all methods",
        base=FEDPG_BASE,
        runs=TABLE3_RUNS,
        check=check_table3,
        winner="fedpg_a2",
        metrics=("honest.pm.l_acc", "honest.pm.s_acc", "honest.pm.g_acc", "gm.acc", "conflict.fraction"),
    ),
]
