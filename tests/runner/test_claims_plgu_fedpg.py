"""The PLGU and FedPG claims' contrasts and diagnoses on hand-made summaries."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from pfl.runner.claims import fedpg, plgu

ROOT = Path(__file__).resolve().parents[2]


def seeds(per_label: dict[str, dict[str, list[float]]]) -> dict:
    """seed -> label -> summary from label -> metric -> per-seed values."""
    n = len(next(iter(next(iter(per_label.values())).values())))
    return {
        s: {lab: {"metrics": {k: v[s] for k, v in metrics.items()}} for lab, metrics in per_label.items()}
        for s in range(n)
    }


def tails(bottom: list[float], top: list[float], model: str = "gm") -> dict[str, list[float]]:
    return {f"{model}.l_acc.bottom5": bottom, f"{model}.l_acc.top5": top}


def test_plgu_contrasts_give_the_paired_differences():
    s = seeds(
        {
            "plgu_lf": tails([0.80, 0.70, 0.75], [0.95, 0.94, 0.96]),
            "fedavg": tails([0.75, 0.72, 0.70], [0.96, 0.97, 0.95]),
            "fedsam": tails([0.78, 0.70, 0.74], [0.95, 0.95, 0.95]),
            "fedsam_matched": tails([0.79, 0.71, 0.73], [0.94, 0.94, 0.94]),
            "plgu_grep": tails([0.60, 0.62, 0.64], [0.90, 0.90, 0.90], "pm"),
            "plgu_grep_rho0": tails([0.58, 0.62, 0.60], [0.90, 0.90, 0.90], "pm"),
            "fedrep": tails([0.55, 0.60, 0.61], [0.93, 0.91, 0.90], "pm"),
            "plgu_ghn": tails([0.50, 0.50, 0.50], [0.90, 0.90, 0.90], "pm"),
            "pfedhn": tails([0.50, 0.52, 0.49], [0.90, 0.90, 0.90], "pm"),
            "ditto": {
                **tails([0.70, 0.70, 0.70], [0.96, 0.96, 0.96]),
                **tails([0.40, 0.45, 0.50], [0.99, 0.99, 0.99], "pm"),
            },
            "pfedme": {
                **tails([0.72, 0.71, 0.70], [0.95, 0.95, 0.95]),
                **tails([0.60, 0.60, 0.60], [0.95, 0.95, 0.95], "pm"),
            },
        }
    )
    for seed, bottom in enumerate([0.45, 0.50, 0.52]):  # PLGU-LF's personalized models
        s[seed]["plgu_lf"]["metrics"].update({"pm.l_acc.bottom5": bottom, "pm.l_acc.top5": 0.97})
    c = {x.name: x for x in plgu.tails_contrasts()(s)}
    # Table 1: PLGU-LF's global model against five; Table 2: three PLGU personalized models against four
    assert len(c) == 2 * (5 + 3 * 4) + 1
    table1 = {f"plgu_lf - {b} (gm.l_acc.bottom5)" for b in ("fedavg", "fedsam", "fedsam_matched", "ditto", "pfedme")}
    assert {name for name in c if "(gm.l_acc.bottom5)" in name} == table1
    table2 = {
        f"{r} - {b} (pm.l_acc.top5)"
        for r in ("plgu_lf", "plgu_grep", "plgu_ghn")
        for b in ("fedrep", "pfedhn", "ditto", "pfedme")
    }
    assert {name for name in c if "(pm.l_acc.top5)" in name} == table2
    assert c["plgu_lf - ditto (gm.l_acc.bottom5)"].diffs == pytest.approx({0: 0.10, 1: 0.0, 2: 0.05})
    assert c["plgu_lf - pfedme (gm.l_acc.top5)"].diffs == pytest.approx({0: 0.0, 1: -0.01, 2: 0.01})
    assert c["plgu_grep - ditto (pm.l_acc.bottom5)"].diffs == pytest.approx({0: 0.20, 1: 0.17, 2: 0.14})
    assert c["plgu_ghn - pfedme (pm.l_acc.top5)"].diffs == pytest.approx({0: -0.05, 1: -0.05, 2: -0.05})
    assert c["plgu_grep - pfedhn (pm.l_acc.bottom5)"].diffs == pytest.approx({0: 0.10, 1: 0.10, 2: 0.15})
    assert c["plgu_ghn - fedrep (pm.l_acc.bottom5)"].diffs == pytest.approx({0: -0.05, 1: -0.10, 2: -0.11})
    assert c["plgu_lf - ditto (pm.l_acc.bottom5)"].diffs == pytest.approx({0: 0.05, 1: 0.05, 2: 0.02})
    assert c["plgu_lf - ditto (pm.l_acc.top5)"].margin == -0.02
    assert c["plgu_lf - fedavg (gm.l_acc.bottom5)"].diffs == pytest.approx({0: 0.05, 1: -0.02, 2: 0.05})
    assert c["plgu_lf - fedavg (gm.l_acc.bottom5)"].margin == 0
    top = c["plgu_lf - fedavg (gm.l_acc.top5)"]
    assert top.diffs == pytest.approx({0: -0.01, 1: -0.03, 2: 0.01}) and top.margin == -0.02
    assert top.excess == pytest.approx([0.01, -0.01, 0.03])  # a drop of 3 points is beyond the 2 allowed
    assert c["plgu_lf - fedsam_matched (gm.l_acc.bottom5)"].diffs == pytest.approx({0: 0.01, 1: -0.01, 2: 0.02})
    assert c["plgu_grep - fedrep (pm.l_acc.top5)"].diffs == pytest.approx({0: -0.03, 1: -0.01, 2: 0.0})
    assert c["plgu_ghn - pfedhn (pm.l_acc.bottom5)"].diffs == pytest.approx({0: 0.0, 1: -0.02, 2: 0.01})
    assert c["plgu_grep - plgu_grep_rho0 (pm.l_acc.bottom5)"].diffs == pytest.approx({0: 0.02, 1: 0.0, 2: 0.04})


def test_plgu_matches_fedsam_to_the_lwsam_radius():
    runs = plgu._runs()
    assert runs["fedsam_matched"][-2:] == ["--method.rho", f"{plgu.RHO / 3:.6g}"]
    assert runs["plgu_grep_rho0"][-4:] == ["--method.pre_step", "false", "--method.rho", "0"]
    assert runs["plgu_grep"][-2:] == ["--method.pre_step", "false"] and runs["plgu_grep_pre"][-1] == "true"


def test_plgu_diagnose_attributes_the_grep_gain():
    s = seeds(
        {
            lab: tails([v, v], [0.9, 0.9], "pm")
            for lab, v in {"fedrep": 0.5, "plgu_grep": 0.55, "plgu_grep_rho0": 0.56, "plgu_grep_pre": 0.6}.items()
        }
    )
    assert plgu.diagnose(s)[-1] == (
        "PLGU-GRep's bottom-5% change over FedRep: +0.0500 with LWSAM, +0.0600 at rho = 0, "
        "+0.1000 with the extra SGD step per body batch."
    )


def accs(l_acc: list[float], s_acc: list[float], g_acc: list[float]) -> dict[str, list[float]]:
    return {"pm.l_acc.mean": l_acc, "pm.s_acc.mean": s_acc, "pm.g_acc.mean": g_acc}


def test_fedpg_table1_contrasts_give_the_paired_differences():
    s = seeds(
        {
            "fedpg": accs([0.90, 0.80], [0.88, 0.72], [0.87, 0.76]),
            "fedavg": accs([0.99, 0.99], [0.40, 0.30], [0.35, 0.80]),
            "ditto": accs([0.99, 0.99], [0.50, 0.50], [0.40, 0.40]),
        }
    )
    c = {x.name: x for x in fedpg.check_table1(s)}
    assert set(c) == {"fedpg S/L - 0.95", "fedpg G/L - 0.95"} | {
        f"fedpg - {b} (pm.{t}_acc.mean)" for b in ("fedavg", "ditto") for t in "sg"
    }
    assert (
        c["fedpg S/L - 0.95"].diffs == pytest.approx({0: 0.88 / 0.90, 1: 0.9}) and c["fedpg S/L - 0.95"].margin == 0.95
    )
    assert c["fedpg - fedavg (pm.g_acc.mean)"].diffs == pytest.approx({0: 0.52, 1: -0.04})
    assert c["fedpg - ditto (pm.s_acc.mean)"].diffs == pytest.approx({0: 0.38, 1: 0.22})
    s[0]["fedpg_paper"] = {"metrics": {"pm.g_acc.mean": 0.1}}
    s[1]["fedpg_paper"] = {"metrics": {"pm.g_acc.mean": 0.9}}
    assert fedpg.table1_notes(s)[1] == "fedpg_paper: G-acc minus the best baseline's, per seed: -0.3000, +0.1000."


def run_dir(tmp_path, name: str, rows: str, header: str) -> str:
    d = tmp_path / name
    d.mkdir()
    d.joinpath("metrics.csv").write_text(header + "\n" + rows)
    return str(d)


def test_fedpg_diagnose_reports_the_update_norm_and_chance(tmp_path):
    s = {
        0: {
            "fedpg_paper": {
                "metrics": {"gm.acc": 0.09},
                "run_dir": run_dir(tmp_path, "p", "25,0.02\n50,0.001\n", "round,fedpg.d_norm"),
            }
        }
    }
    assert fedpg.diagnose_table1(s) == [
        "fedpg_paper: G-model accuracy 0.090 (chance 0.100); ||d|| 0.02 at the first evaluation, 0.001 at the last."
    ]


def test_fedpg_table3_contrasts_and_lambda(tmp_path, monkeypatch):
    monkeypatch.setattr(fedpg, "honest_clean", lambda summary, key: {"pm.s_acc": 0.80, "pm.g_acc": 0.79}[key])
    lam = "round,fedpg.lambda_fairness"

    def run(name: str, s_acc: float, g_acc: float, gm: float, lam_rows: str = "") -> dict:
        metrics = {"honest.pm.s_acc.mean": s_acc, "honest.pm.g_acc.mean": g_acc, "gm.acc": gm}
        return {"metrics": metrics, "run_dir": run_dir(tmp_path, name, lam_rows, lam)}

    s = {
        0: {
            "fedpg_clean": run("clean", 0.0, 0.0, 0.78, "1,0.2\n2,0.3\n"),
            "fedpg_a1": run("a1", 0.79, 0.70, 0.77, "1,0.0\n2,0.1\n"),
            "fedavg_a1": run("avg1", 0.3, 0.72, 0.3),
            "fedpg_official_a1": run("off1", 0.3, 0.99, 0.3),  # FedPG's own rows are not baselines
        }
    }
    (drop, best) = fedpg.check_table3(s)
    assert drop.name == "0.05 - fedpg's largest honest drop under A1" and drop.diffs == pytest.approx({0: 0.05 - 0.09})
    assert best.diffs == pytest.approx({0: 0.70 - 0.72})
    assert fedpg.diagnose_table3(s) == ["fedpg: mean λ on ∇F: fedpg_clean 0.250, fedpg_a1 0.050."]


def test_fedpg_table3_runs_fedavg_with_median_and_krum_under_each_attack():
    from pfl.runner.args import parse_fit_args

    for a in fedpg.ATTACKS:
        median = parse_fit_args([*fedpg.FEDPG_BASE, *fedpg.TABLE3_RUNS[f"fedavg_median_{a}"]])[0]
        krum = parse_fit_args([*fedpg.FEDPG_BASE, *fedpg.TABLE3_RUNS[f"fedavg_krum_{a}"]])[0]
        plain = parse_fit_args([*fedpg.FEDPG_BASE, *fedpg.TABLE3_RUNS[f"fedavg_{a}"]])[0]
        assert (median.method.name, median.server.aggregator) == ("fedavg", "median")
        assert (krum.server.aggregator, krum.server.krum_f) == ("krum", 2)
        assert median.attack == krum.attack == plain.attack and median.attack.kind != "none"
        assert plain.server.aggregator == "mean"


def test_fedpg_table3_notes_the_robust_rows_without_contrasting_them(monkeypatch):
    monkeypatch.setattr(fedpg, "honest_clean", lambda summary, key: 0.8)
    g = "honest.pm.g_acc.mean"
    s = seeds(
        {
            "fedavg_a1": {g: [0.2, 0.4], "honest.pm.s_acc.mean": [0.5, 0.5], "gm.acc": [0.5, 0.5]},
            "fedavg_median_a1": {g: [0.7, 0.8], "honest.pm.s_acc.mean": [0.5, 0.5], "gm.acc": [0.5, 0.5]},
            "fedavg_krum_a1": {g: [0.6, 0.6], "honest.pm.s_acc.mean": [0.5, 0.5], "gm.acc": [0.5, 0.5]},
            "fedpg_a1": {g: [0.5, 0.7], "honest.pm.s_acc.mean": [0.5, 0.5], "gm.acc": [0.5, 0.5]},
        }
    )
    assert fedpg.robust_notes(s) == [
        "Honest G-acc under A1, mean over seeds: fedavg_a1 0.3000, fedavg_median_a1 0.7500, fedavg_krum_a1 0.6000, "
        "fedpg_a1 0.6000."
    ]
    (best,) = fedpg.check_table3(s)  # the robust rows are no baselines of FedPG's contrast
    assert best.diffs == pytest.approx({0: 0.5 - 0.2, 1: 0.7 - 0.4})


def test_plgu_rho_is_the_method_configs_and_the_matched_run_divides_it_by_the_layers():
    for name in ("fedsam", "plgu_lf", "plgu_grep", "plgu_ghn"):
        init = yaml.safe_load((ROOT / "conf" / "method" / f"{name}.yaml").read_text())
        assert init["method"]["rho"] == plgu.RHO, name
    matched = plgu._runs()["fedsam_matched"]
    assert float(matched[matched.index("--method.rho") + 1]) == pytest.approx(plgu.RHO / plgu.MLP_LAYERS, rel=1e-5)


def test_plgu_diagnose_states_each_pairs_tails():
    s = seeds({"plgu_lf": tails([0.31, 0.32], [0.91, 0.91]), "fedavg": tails([0.2, 0.2], [0.95, 0.97])})
    assert plgu.diagnose(s) == ["plgu_lf vs fedavg (gm): bottom-5% 0.3150 vs 0.2000, top-5% 0.9100 vs 0.9600."]


def test_fedpg_attacks_make_the_configured_share_of_clients_malicious():
    for a in fedpg.ATTACKS:
        conf = yaml.safe_load((ROOT / "conf" / "experiment" / f"fedpg_attack_{a}.yaml").read_text())
        assert conf["attack"]["fraction"] == fedpg.ATTACK_FRACTION


def test_fedpg_honest_clean_averages_the_clean_runs_clients_the_attacks_leave_honest(tmp_path):
    from pfl.federation.attacks import malicious_clients

    accs = [0.1 * (i + 1) for i in range(10)]
    tmp_path.joinpath("clients.csv").write_text("client,pm.g_acc\n" + "".join(f"{i},{a}\n" for i, a in enumerate(accs)))
    summary = {"seed": 3, "num_clients": 10, "run_dir": str(tmp_path)}
    bad = set(malicious_clients(3, 10, fedpg.ATTACK_FRACTION).tolist())
    assert len(bad) == 1
    honest = [a for i, a in enumerate(accs) if i not in bad]
    assert fedpg.honest_clean(summary, "pm.g_acc") == pytest.approx(sum(honest) / len(honest))


def test_fedpg_table3_reads_the_clean_run_and_skips_a_seed_without_fedpgs_attacked_run(tmp_path):
    (tmp_path / "clients.csv").write_text("client,pm.s_acc,pm.g_acc\n" + "".join(f"{i},0.8,0.8\n" for i in range(10)))
    m = {"honest.pm.s_acc.mean": 0.7, "honest.pm.g_acc.mean": 0.7, "gm.acc": 0.7}
    clean = {"metrics": {"gm.acc": 0.8}, "seed": 0, "num_clients": 10, "run_dir": str(tmp_path)}
    s = {
        0: {
            "fedpg_clean": clean,
            "fedpg_a1": {"metrics": m},
            "fedavg_a1": {"metrics": {**m, "honest.pm.g_acc.mean": 0.5}},
        },
        1: {"fedavg_a1": {"metrics": m}},  # FedPG's attacked run did not finish on seed 1
    }
    drop, best = fedpg.check_table3(s)
    assert drop.diffs == pytest.approx({0: 0.05 - 0.1}) and best.diffs == pytest.approx({0: 0.2})


def test_fedpg_diagnose_reports_the_last_logged_norm(tmp_path):
    rows = "25,0.02\n50,0.01\n75,0.001\n"
    s = {0: {"fedpg": {"metrics": {"gm.acc": 0.5}, "run_dir": run_dir(tmp_path, "f", rows, "round,fedpg.d_norm")}}}
    assert fedpg.diagnose_table1(s)[0].endswith("||d|| 0.02 at the first evaluation, 0.001 at the last.")
