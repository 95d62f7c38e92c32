"""The report's table: runs that differ only in seed are one row (mean ± std over seeds), a column per
swept setting, the best of each column marked; markdown, csv and LaTeX."""

from __future__ import annotations

import csv
import io
import json
import re

import pytest

from pfl.cli import main
from pfl.errors import ConfigError
from pfl.metrics.report import report
from tests.helpers.reports import SEEDS, config, latex_rows, sample_std, two_methods_three_seeds, write_run


def test_seeds_are_grouped_with_mean_and_sample_std(tmp_path):
    runs = two_methods_three_seeds(tmp_path)
    md = report(runs, ["pm.l_acc", "rounds_to_target"]).splitlines()
    assert md[0] == "| run | method | n | pm.l_acc | rounds_to_target |"
    assert len(md) == 4  # header, rule, one row per method
    assert md[2] == "| fedavg-s0 +2 | fedavg | 3 | **0.8000 ± 0.1000** | 30.0 ± 10.0 |"
    ditto_std = sample_std(SEEDS["ditto"]["pm.l_acc"])
    assert md[3] == f"| ditto-s0 +2 | ditto | 3 | 0.7000 ± {ditto_std:.4f} | **20.0 ± 10.0** |"  # fewer rounds win


def test_csv_is_numeric_with_std_and_best_columns(tmp_path):
    runs = two_methods_three_seeds(tmp_path)
    rows = list(csv.DictReader(io.StringIO(report(runs, ["pm.l_acc", "rounds_to_target"], "csv"))))
    assert list(rows[0]) == [
        "run", "method", "n",
        "pm.l_acc", "pm.l_acc_std", "pm.l_acc_client_std", "pm.l_acc_best",
        "rounds_to_target", "rounds_to_target_std", "rounds_to_target_best",
    ]  # fmt: skip
    for row in rows:
        for key, cell in row.items():
            if key not in ("run", "method"):
                float(cell)  # every number parses: no ±, no *, no parentheses
    fedavg, ditto = rows
    assert float(fedavg["pm.l_acc"]) == pytest.approx(0.8) and float(fedavg["pm.l_acc_std"]) == pytest.approx(0.1)
    assert float(ditto["pm.l_acc_std"]) == pytest.approx(sample_std(SEEDS["ditto"]["pm.l_acc"]))
    assert float(fedavg["pm.l_acc_client_std"]) == pytest.approx(0.05)
    assert (fedavg["pm.l_acc_best"], ditto["pm.l_acc_best"]) == ("1", "0")
    assert (fedavg["rounds_to_target_best"], ditto["rounds_to_target_best"]) == ("0", "1")
    assert fedavg["n"] == "3"


def test_latex_is_a_well_formed_booktabs_tabular(tmp_path):
    runs = two_methods_three_seeds(tmp_path)
    tex = report(runs, ["pm.l_acc", "rounds_to_target"], "latex", digits=2)
    depth = 0
    for ch in re.sub(r"\\[{}]", "", tex):  # escaped braces are text
        depth += {"{": 1, "}": -1}.get(ch, 0)
        assert depth >= 0
    assert depth == 0
    assert tex.count("\\begin{tabular}") == tex.count("\\end{tabular}") == 1
    assert tex.index("\\toprule") < tex.index("\\midrule") < tex.index("\\bottomrule")
    lines = [line for line in tex.splitlines() if line.endswith("\\\\")]
    spec = re.search(r"\\begin\{tabular\}\{(\w+)\}", tex).group(1)
    assert len(lines) == 3 and all(line.count("&") == len(spec) - 1 for line in lines)
    assert lines[0] == "method & n & pm.l\\_acc & rounds\\_to\\_target \\\\"
    assert latex_rows(tex)[0] == "fedavg & 3 & \\textbf{0.80 $\\pm$ 0.10} & 30.0 $\\pm$ 10.0 \\\\"
    assert not re.search(r"(?<!\\)_", tex.split("\\begin")[1])  # every underscore escaped
    assert "±" not in tex


def test_latex_escapes_labels_and_writes_powers_of_ten(tmp_path):
    a = write_run(tmp_path, "a", "pgfed_ce", {"comm.up_bytes.per_round": 1044880.0, "gm.acc": 0.5})
    b = write_run(tmp_path, "b", "fed&avg", {"comm.up_bytes.per_round": 2089760.0, "gm.acc": 0.4})
    rows = latex_rows(report([a, b], ["comm.up_bytes.per_round", "gm.acc"], "latex"))
    assert rows[0] == "pgfed\\_ce & 1 & \\textbf{$1.045\\times10^{6}$} & \\textbf{0.5000} \\\\"
    assert rows[1].startswith("fed\\&avg & 1 & $2.09\\times10^{6}$")


def test_swept_settings_become_columns_and_split_groups(tmp_path):
    runs = []
    for mu in (0.0, 0.5):
        for seed in (0, 1):
            name = f"prox-mu{mu}-s{seed}"
            cfg = config("fedprox", seed, tmp_path, name, mu=mu)
            runs.append(write_run(tmp_path, name, "fedprox", {"gm.acc": mu + 0.1 * seed}, config=cfg))
    cfg = config("ditto", 0, tmp_path, "ditto", lam=0.1)
    cfg["data"]["alpha"] = 0.1
    runs.append(write_run(tmp_path, "ditto", "ditto", {"gm.acc": 0.3}, config=cfg))
    md = report(runs, ["gm.acc"]).splitlines()
    # mu differs within fedprox; ditto's lam is its own, constant; alpha differs between groups
    assert md[0] == "| run | method | method.mu | data.alpha | n | gm.acc |"
    assert md[2] == "| prox-mu0.0-s0 +1 | fedprox | 0.0 | 0.5 | 2 | 0.0500 ± 0.0707 |"
    assert md[3] == "| prox-mu0.5-s0 +1 | fedprox | 0.5 | 0.5 | 2 | **0.5500 ± 0.0707** |"
    assert md[4] == "| ditto | ditto | - | 0.1 | 1 | 0.3000 |"
    per_run = report(runs, ["gm.acc"], group=False).splitlines()
    assert per_run[0] == "| run | method | method.mu | data.alpha | seed | n | gm.acc |" and len(per_run) == 7


def test_per_run_keeps_a_repeat_of_the_same_seed_apart(tmp_path):
    cfg = config("fedavg", 0, tmp_path, "a")
    runs = [write_run(tmp_path, n, "fedavg", {"gm.acc": acc}, config=cfg) for n, acc in (("a", 0.5), ("b", 0.7))]
    assert report(runs, ["gm.acc"]).splitlines()[2] == "| a +1 | fedavg | 2 | 0.6000 ± 0.1414 |"
    assert report(runs, ["gm.acc"], group=False).splitlines()[2:] == [
        "| a | fedavg | 1 | 0.5000 |",
        "| b | fedavg | 1 | **0.7000** |",
    ]


def test_runs_without_config_are_grouped_by_their_summary(tmp_path):
    runs = [write_run(tmp_path, f"r{s}", "fedavg", {"gm.acc": 0.5 + 0.1 * s}) for s in range(2)]
    runs.append(write_run(tmp_path, "r2", "local", {"gm.acc": 0.4}))
    md = report(runs, ["gm.acc"]).splitlines()
    assert md[2:] == ["| r0 +1 | fedavg | 2 | **0.5500 ± 0.0707** |", "| r2 | local | 1 | 0.4000 |"]


def test_best_per_column_is_marked_in_markdown_and_csv(tmp_path):
    a = write_run(tmp_path, "a", "fedavg", {"pm.l_acc.mean": 0.8, "pm.l_acc.std": 0.1, "comm.up_bytes.total": 200.0})
    b = write_run(tmp_path, "b", "ditto", {"pm.l_acc.mean": 0.7, "pm.l_acc.std": 0.05, "comm.up_bytes.total": 100.0})
    md = report([a, b], ["pm.l_acc", "comm.up_bytes.total", "ptr"]).splitlines()
    assert md[0] == "| run | method | n | pm.l_acc | comm.up_bytes.total | ptr |"
    assert md[2] == "| a | fedavg | 1 | **0.8000 (0.1000)** | 200.0000 | - |"
    assert md[3] == "| b | ditto | 1 | 0.7000 (0.0500) | **100.0000** | - |"  # fewer bytes is better
    rows = list(csv.reader(io.StringIO(report([a, b], ["pm.l_acc", "comm.up_bytes.total"], "csv"))))
    assert rows[1] == ["a", "fedavg", "1", "0.8", "", "0.1", "1", "200.0", "", "0"]
    assert rows[2] == ["b", "ditto", "1", "0.7", "", "0.05", "0", "100.0", "", "1"]


def test_ties_are_all_marked_and_best_test_runs_are_labelled(tmp_path):
    a = write_run(tmp_path, "a", "fedavg", {"ptr": 0.5, "ptr_mae": 0.2})
    b = write_run(tmp_path, "b", "fedavg", {"best_test.ptr": 0.5, "best_test.ptr_mae": 0.4}, select="best_test")
    lines = report([a, b], ["ptr", "ptr_mae"]).splitlines()
    assert lines[0] == "| run | method | select | n | ptr | ptr_mae |"
    assert lines[2] == "| a | fedavg | final | 1 | **0.5000** | 0.2000 |"
    assert lines[3] == "| b [best_test] | fedavg | best_test | 1 | **0.5000** | **0.4000** |"  # a pass rate on MAE


def test_default_columns_are_only_those_measured(tmp_path):
    a = write_run(tmp_path, "a", "local", {"pm.l_acc.mean": 0.5, "pm.l_acc.std": 0.0})
    header = report([a]).splitlines()[0]
    assert header == "| run | method | n | pm.l_acc |"


def test_report_bad_input(tmp_path, capsys):
    with pytest.raises(ConfigError, match="RUN_DIR"):
        report([tmp_path])
    a = write_run(tmp_path, "a", "local", {})
    with pytest.raises(ConfigError, match="--format"):
        report([a], None, "html")
    with pytest.raises(ConfigError, match="--digits"):
        report([a], None, digits=-1)
    assert main(["report"]) == 2
    assert main(["report", str(tmp_path / "missing")]) == 2
    assert "summary.json" in capsys.readouterr().err


def test_rounds_to_target_cells_are_counts_fewest_is_best_and_null_reads_never(tmp_path):
    a = write_run(tmp_path, "a", "fedavg", {"rounds_to_target": 30})
    b = write_run(tmp_path, "b", "ditto", {"rounds_to_target": 20})
    c = write_run(tmp_path, "c", "local", {"rounds_to_target": None})
    lines = report([a, b, c]).splitlines()
    assert lines[2:] == ["| a | fedavg | 1 | 30 |", "| b | ditto | 1 | **20** |", "| c | local | 1 | never |"]


def test_seeds_that_never_reach_the_target_are_counted_and_the_cell_cannot_win(tmp_path):
    runs = []
    for method, rounds in (("fedavg", [20, None, 30]), ("ditto", [26, 30, 28])):
        for seed, r in enumerate(rounds):
            name = f"{method}{seed}"
            runs.append(
                write_run(tmp_path, name, method, {"rounds_to_target": r}, config=config(method, seed, tmp_path, name))
            )
    lines = report(runs, ["rounds_to_target"]).splitlines()
    assert lines[2] == f"| fedavg0 +2 | fedavg | 3 | 25.0 ± {sample_std([20, 30]):.1f} [2/3] |"
    assert lines[3] == "| ditto0 +2 | ditto | 3 | 28.0 ± 2.0 |"  # the only complete cell: no best among one
    rows = list(csv.DictReader(io.StringIO(report(runs, ["rounds_to_target"], "csv"))))
    assert [r["rounds_to_target_n"] for r in rows] == ["2", "3"]


def test_table_runs_tell_repeats_apart_only_by_the_seed_unless_asked(tmp_path):
    from pfl.metrics.report import build_table, group_runs, run_settings, table_runs

    summaries = [{"method": "fedavg", "seed": s, "metrics": {"gm.acc": 0.5 + 0.1 * s}} for s in (0, 1)]
    configs = [config("fedavg", s, tmp_path, f"r{s}") for s in (0, 1)]
    runs = table_runs(summaries, ["r0", "r1"], configs)  # grouped by default
    assert runs[0].settings == runs[1].settings and "seed" not in runs[0].settings
    assert runs[0].settings["client.lr"] == 0.1  # from the config
    assert [len(g.runs) for g in group_runs(runs)] == [2]  # the same settings: one group by default
    assert [g.runs for g in group_runs(runs, group=False)] == [[runs[0]], [runs[1]]]
    assert [r.settings["seed"] for r in table_runs(summaries, ["r0", "r1"], configs, group=False)] == [0, 1]
    assert table_runs(summaries, ["r0", "r1"])[0].settings == {"method": "fedavg"}  # no configs: the summaries
    assert "seed" not in run_settings(summaries[0], None)
    assert run_settings({"method": "x"}, {"seed": 3, "method": {"name": "x"}}, keep_seed=True)["seed"] == 3
    with pytest.raises(ValueError):  # a name or config per summary, never silently cut
        table_runs(summaries, ["r0"], configs)
    header, rows, _ = build_table(summaries, ["r0", "r1"], ["gm.acc"])
    assert len(rows) == 1 and rows[0][2] == "2"  # grouped by default


def test_a_missing_setting_differs_from_a_null_one_and_key_order_does_not_count(tmp_path):
    a = config("fedavg", 0, tmp_path, "a", mu=None, opts=[{"x": 1, "y": 2}])
    b = config("fedavg", 1, tmp_path, "b", opts=[{"y": 2, "x": 1}])
    c = config("fedavg", 2, tmp_path, "c", mu=None, opts=[{"y": 2, "x": 1}])
    runs = [
        write_run(tmp_path, n, "fedavg", {"gm.acc": 0.5}, config=cfg) for n, cfg in zip("abc", (a, b, c), strict=True)
    ]
    md = report(runs, ["gm.acc"]).splitlines()
    assert md[0] == "| run | method | method.mu | n | gm.acc |"
    assert md[2:] == ["| a +1 | fedavg | null | 2 | **0.5000 ± 0.0000** |", "| b | fedavg | - | 1 | **0.5000** |"]
    for name, opts in (("d", {"x": 1, "y": 2}), ("e", {"y": 2, "x": 1})):  # summaries keep their key order
        (tmp_path / name).mkdir()
        summary = {"method": "fedavg", "hparams": {"opts": opts}, "metrics": {"gm.acc": 0.5}}
        (tmp_path / name / "summary.json").write_text(json.dumps(summary))
    assert report([tmp_path / "d", tmp_path / "e"], ["gm.acc"]).splitlines()[2:] == [
        "| d +1 | fedavg | 2 | 0.5000 ± 0.0000 |"
    ]


def test_numbers_from_1000_up_are_significant_digits_and_tiny_spreads_negative_powers(tmp_path):
    runs = [write_run(tmp_path, f"r{i}", "fedavg", {"x": v}) for i, v in enumerate([1000.0, 1000.00001])]
    assert report(runs[:1], ["x"]).splitlines()[2] == "| r0 | fedavg | 1 | 1000 |"
    tex = latex_rows(report(runs, ["x"], "latex"))[0]
    assert tex == "fedavg & 2 & 1000 $\\pm$ $7.071\\times10^{-6}$ \\\\"  # the spread in the style of its mean
    small = write_run(tmp_path, "s", "fedavg", {"x": 0.25})
    assert report([small], ["x"], digits=0).splitlines()[2] == "| s | fedavg | 1 | 0 |"


def test_render_and_cells_default_to_four_decimals_and_every_column_gets_its_best(tmp_path):
    from pfl.metrics.report import Cell, build_table, render

    assert Cell(1, [0.123456]).text() == "0.1235"
    a = write_run(tmp_path, "a", "fedavg", {"only_a": 1.0, "x": 0.2})
    b = write_run(tmp_path, "b", "ditto", {"x": 0.3})
    header, rows, best = build_table([json.loads((r / "summary.json").read_text()) for r in (a, b)], ["a", "b"],
                                     ["only_a", "x"])  # fmt: skip
    assert best == [[False, False], [False, True]]  # a column with one value has no best; the next still does
    assert render(header, rows, best).splitlines()[3] == "| b | ditto | 1 | - | **0.3000** |"
    assert "\\begin{tabular}{lrrr}" in render(header, rows, best, "latex")  # method left; n and numbers right


def test_measured_but_never_reached_reads_never_in_a_cell_of_several_runs(tmp_path):
    runs = [write_run(tmp_path, f"r{i}", "fedavg", {"rounds_to_target": None}) for i in range(2)]
    assert report(runs, ["rounds_to_target"]).splitlines()[2] == "| r0 +1 | fedavg | 2 | never |"


def test_an_option_a_run_predates_counts_at_its_default(tmp_path, capsys):
    """A run made before pfl had an option (its config.yaml lacks the key) groups with today's runs that
    leave the option at its default, and apart from runs that change it; the same in report, compare and plots."""
    import pandas as pd

    from pfl.api import Run, compare
    from pfl.metrics.compare_plots import plot_groups
    from pfl.runner.args import default_config

    defaults = default_config("fedavg")
    assert defaults["server"]["aggregator"] == "mean" and defaults["method"] == {"name": "fedavg", **defaults["method"]}
    assert default_config("no_such_method") is None
    old = config("fedavg", 0, tmp_path, "old")
    new = config("fedavg", 1, tmp_path, "new") | {"server": {"aggregator": "mean"}}
    robust = config("fedavg", 2, tmp_path, "robust") | {"server": {"aggregator": "median"}}
    runs = [
        write_run(tmp_path, n, "fedavg", {"gm.acc": acc}, config=c)
        for n, c, acc in (("old", old, 0.5), ("new", new, 0.7), ("robust", robust, 0.1))
    ]
    md = report(runs, ["gm.acc"], defaults=default_config).splitlines()
    assert md[0] == "| run | method | server.aggregator | n | gm.acc |"
    assert md[2:] == [
        "| old +1 | fedavg | mean | 2 | **0.6000 ± 0.1414** |",
        "| robust | fedavg | median | 1 | 0.1000 |",
    ]
    assert len(report(runs, ["gm.acc"]).splitlines()) == 5  # without defaults the old run is a row of its own
    assert main(["report", *map(str, runs), "--metrics", "gm.acc"]) == 0
    assert capsys.readouterr().out.splitlines() == md
    loaded = [Run(r, json.loads((r / "summary.json").read_text()), pd.DataFrame(), pd.DataFrame(), c)
              for r, c in zip(runs, (old, new, robust), strict=True)]  # fmt: skip
    assert list(compare(loaded, ["gm.acc"])["n"]) == [2, 1]
    assert [len(g.run_dirs) for g in plot_groups(runs, defaults=default_config)] == [2, 1]
    unknown = config("not_registered", 3, tmp_path, "u")
    assert run_settings_of(unknown) == run_settings_of(unknown, defaults=default_config)  # nothing to fill


def run_settings_of(cfg: dict, **kwargs) -> dict:
    from pfl.metrics.report import run_settings

    return run_settings({"method": cfg["method"]["name"]}, cfg, **kwargs)
