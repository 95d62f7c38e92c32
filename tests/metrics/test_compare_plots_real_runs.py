"""The report's figures of runs `fit` made draw what their metrics.csv and clients.csv hold."""

from __future__ import annotations

import csv

from pfl.cli import main
from pfl.metrics.compare_plots import clients_figure, curve_figure, plot_groups
from tests.helpers.report_plots import drawn

TINY = [
    "--data.num_clients", "3", "--trainer.rounds", "2", "--trainer.eval_every", "1", "--model.hidden", "[8]",
    "--tracking.wandb", "false", "--trainer.progress", "false",
]  # fmt: skip


def test_figures_of_real_runs_draw_what_their_files_hold(tmp_path, capsys):
    dirs = []
    for name, lr in (("lr1", "0.1"), ("lr2", "0.05")):
        assert main(["fit", *TINY, "--client.lr", lr, "--tracking.root", str(tmp_path), "--tracking.name", name]) == 0
        dirs.append(tmp_path / name)
    groups = plot_groups(dirs)
    assert [g.label for g in groups] == ["fedavg, client.lr=0.1", "fedavg, client.lr=0.05"]
    fig, key = curve_figure(groups)
    for line, run in zip(drawn(fig, "mean"), dirs, strict=True):
        with open(run / "metrics.csv") as fh:
            rows = list(csv.DictReader(fh))
        assert list(line.get_xdata()) == [1, 2] and list(line.get_ydata()) == [float(r[key]) for r in rows]
    fig, _ = clients_figure(groups)
    for dots, run in zip(drawn(fig, "clients"), dirs, strict=True):
        with open(run / "clients.csv") as fh:
            assert sorted(dots.get_ydata()) == sorted(float(r["pm.l_acc"]) for r in csv.DictReader(fh))
    capsys.readouterr()
    out = tmp_path / "cmp.png"
    assert main(["report", *map(str, dirs), "--plot", str(out), "--plot-clients", str(tmp_path / "cl.png")]) == 0
    assert out.exists() and (tmp_path / "cl.png").exists()
