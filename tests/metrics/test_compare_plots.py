"""The report's figures: the runs' curves over rounds and their per-client scores, grouped and labelled as
the table groups them (a group: runs that differ only in their seed)."""

from __future__ import annotations

import numpy as np
import pytest
from matplotlib import colors, rcParams

from pfl.cli import main
from pfl.errors import ConfigError
from pfl.metrics.compare_plots import clients_figure, curve_figure, curve_points, plot_groups, read_rows
from pfl.runner.outputs import RunFiles
from pfl.runner.reproduce import Job, comparison_plots
from tests.helpers.report_plots import CLIENTS, CURVES, SETTING, band_edges, drawn, write_run


def test_a_group_is_drawn_as_the_mean_of_its_seeds_with_their_min_max_band(runs):
    fig, key = curve_figure(plot_groups(runs))
    assert key == "pm.l_acc.mean"  # the main accuracy when none is asked for
    means = drawn(fig, "mean")
    assert len(means) == 2  # one line per group, not per run
    a, b = CURVES["a0"][key], CURVES["a1"][key]
    assert list(means[0].get_xdata()) == [1, 2, 3]
    assert list(means[0].get_ydata()) == pytest.approx([(x + y) / 2 for x, y in zip(a, b, strict=True)])
    assert list(means[1].get_ydata()) == pytest.approx(CURVES["b0"][key])  # one run: its own curve
    (band,) = drawn(fig, "band")  # the single-run group has none
    expected = {
        float(r + 1): {round(min(x, y), 9), round(max(x, y), 9)} for r, (x, y) in enumerate(zip(a, b, strict=True))
    }
    assert band_edges(band) == expected
    assert tuple(band.get_facecolor()[0][:3]) == pytest.approx(colors.to_rgb(means[0].get_color()))
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == [
        "fedavg, client.lr=0.1 (2 seeds)",
        "fedavg, client.lr=0.05 (1 seed)",
    ]
    assert "band: min–max over seeds" in ax.get_title() and "mean over seeds" in ax.get_title()
    assert ax.get_xlabel() == "round" and ax.get_ylabel() == "accuracy: P-models, own test (L-acc)"
    assert ax.get_title().startswith("digits, Dirichlet α=0.5\n")  # the setting every run shares
    assert list(ax.get_xticks()) == [1, 2, 3]  # the evaluated rounds
    assert means[0].get_color() == "C0" and means[1].get_color() == "C1"


def test_plot_metric_chooses_the_curve_and_a_name_without_mean_reads_its_mean(runs, tmp_path):
    fig, key = curve_figure(plot_groups(runs), "gm.acc")
    assert key == "gm.acc"
    assert list(drawn(fig, "mean")[0].get_ydata()) == pytest.approx([0.15, 0.25, 0.4])
    files = RunFiles(tmp_path / "a0")
    files.write_metrics(
        [{"round": 1, "pm.l_loss.mean": 2.0, "comm.up_bytes.total": 9.0}, {"round": 2, "pm.l_loss.mean": 1.0}]
    )
    fig, key = curve_figure(plot_groups(runs[:1]), "pm.l_loss")
    assert key == "pm.l_loss.mean" and list(drawn(fig, "mean")[0].get_ydata()) == [2.0, 1.0]
    assert fig.axes[0].get_ylabel() == "loss: P-models, own test"
    fig, key = curve_figure(plot_groups(runs[:1]), "comm.up_bytes.total")
    assert list(drawn(fig, "mean")[0].get_xdata()) == [1] and fig.axes[0].get_ylabel() == "comm.up_bytes.total"


def test_the_default_curve_is_the_first_main_metric_every_run_logged(tmp_path):
    a = write_run(tmp_path, "a", 0, 0.1, {"gm.acc": [0.1, 0.2], "pm.mae.mean": [3.0, 2.0]}, [0.5])
    b = write_run(tmp_path, "b", 0, 0.2, {"pm.l_acc.mean": [0.3, 0.4], "gm.acc": [0.5, 0.6]}, [0.5])
    fig, key = curve_figure(plot_groups([a, b]))
    assert key == "gm.acc"  # pm.l_acc.mean comes first but only b logged it


def test_each_round_averages_the_runs_that_evaluated_it_and_blank_cells_are_skipped(tmp_path):
    RunFiles(tmp_path).write_metrics([{"round": 1, "x": 1.0}, {"round": 2, "y": 5.0}, {"round": 3, "x": 3.0}])
    rows = read_rows(tmp_path / "metrics.csv")
    assert rows == [{"round": 1.0, "x": 1.0}, {"round": 2.0, "y": 5.0}, {"round": 3.0, "x": 3.0}]
    other = [{"round": 1.0, "x": 2.0}, {"round": 2.0, "x": 4.0}]
    x, mean, low, high = curve_points([rows, other], "x")
    assert list(x) == [1, 2, 3]
    assert list(mean) == [1.5, 4.0, 3.0] and list(low) == [1.0, 4.0, 3.0] and list(high) == [2.0, 4.0, 3.0]


def test_clients_are_one_box_per_group_with_the_clients_of_its_seeds_pooled(runs):
    fig, key = clients_figure(plot_groups(runs))
    assert key == "pm.l_acc"
    pooled = [CLIENTS["a0"] + CLIENTS["a1"], CLIENTS["b0"]]
    medians, means = drawn(fig, "medians"), drawn(fig, "means")
    assert len(medians) == 2 and len(means) == 2
    for i, values in enumerate(pooled):
        assert medians[i].get_ydata()[0] == pytest.approx(np.median(values))
        assert means[i].get_ydata()[0] == pytest.approx(np.mean(values))
        whiskers = drawn(fig, "whiskers")[2 * i : 2 * i + 2]  # from the quartiles out to min and max
        ends = sorted(float(y) for w in whiskers for y in w.get_ydata())
        assert ends == pytest.approx(sorted([*np.percentile(values, [25, 75]), min(values), max(values)]))
    dots = drawn(fig, "clients")
    assert [sorted(d.get_ydata()) for d in dots] == [sorted(v) for v in pooled]
    spans = [(min(b.get_xdata()), max(b.get_xdata())) for b in drawn(fig, "boxes")]
    assert spans[0][1] < spans[1][0]  # boxes side by side, not overlapping
    for (left, right), d in zip(spans, dots, strict=True):  # every client inside its own box, apart
        assert all(left < x < right for x in d.get_xdata()) and len(set(d.get_xdata())) == len(d.get_xdata())
        assert np.mean(d.get_xdata()) == pytest.approx((left + right) / 2)  # centred on it
    assert fig.get_figwidth() == rcParams["figure.figsize"][0]  # two groups fit the default width
    ax = fig.axes[0]
    ticks = [t.get_text() for t in ax.get_xticklabels()]
    assert ticks == ["fedavg, client.lr=0.1\n3 clients × 2 seeds", "fedavg, client.lr=0.05\n3 clients"]
    assert ax.get_ylabel() == "P-model accuracy, own test, per client"
    assert ax.get_title().startswith("digits, Dirichlet α=0.5\nP-model accuracy, own test per client")
    # each group in its own colour, the one its curve has in the curve figure
    assert [b.get_color() for b in drawn(fig, "boxes")] == ["C0", "C1"]
    assert [d.get_color() for d in dots] == ["C0", "C1"]
    assert "seeds pooled" in ax.get_title() and "whiskers: min–max" in ax.get_title()


def test_many_groups_widen_the_client_figure_to_keep_their_labels_apart(tmp_path):
    runs = [write_run(tmp_path, f"r{i}", 0, 0.01 * (i + 1), {"pm.l_acc.mean": [0.1]}, [0.5, 0.6]) for i in range(8)]
    fig, _ = clients_figure(plot_groups(runs))
    assert len(drawn(fig, "boxes")) == 8 and fig.get_figwidth() == pytest.approx(8 * 1.6)


def test_a_folder_without_write_permission_is_refused(runs, tmp_path, monkeypatch, capsys):
    import pfl.metrics.compare_plots as cp

    monkeypatch.setattr(cp.os, "access", lambda path, mode: not mode & cp.os.W_OK)  # as for a read-only folder
    assert main(["report", *map(str, runs), "--plot", str(tmp_path / "c.png")]) == 2
    assert f"--plot: cannot write {tmp_path}/c.png: {tmp_path} is not a writable folder" in capsys.readouterr().err


def test_per_run_groups_draw_every_run_labelled_with_its_seed(runs):
    groups = plot_groups(runs, group=False)
    assert [g.label for g in groups] == [
        "fedavg, client.lr=0.1, seed=0",
        "fedavg, client.lr=0.1, seed=1",
        "fedavg, client.lr=0.05, seed=0",
    ]
    assert [g.run_dirs for g in groups] == [[r] for r in runs]
    fig, _ = curve_figure(groups)
    assert len(drawn(fig, "mean")) == 3 and not drawn(fig, "band")


def test_a_metric_the_runs_lack_is_one_line_naming_it_and_the_available_ones(runs, tmp_path, capsys):
    with pytest.raises(ConfigError, match=r"--plot-metric: 'pm\.nope' is not in every run's metrics\.csv") as err:
        curve_figure(plot_groups(runs), "pm.nope")
    assert "available in all: pm.l_acc.mean, gm.acc" in str(err.value) and "\n" not in str(err.value)
    local = write_run(tmp_path, "local", 0, 0.3, {"pm.l_acc.mean": [0.5, 0.6, 0.7]}, [0.4])
    with pytest.raises(ConfigError, match=r"'gm\.acc' is not .*missing in local; available in all: pm\.l_acc\.mean\)"):
        curve_figure(plot_groups([*runs, local]), "gm.acc")
    out = tmp_path / "out" / "c.png"
    assert main(["report", *map(str, runs), "--plot", str(out), "--plot-metric", "pm.nope"]) == 2
    stderr = capsys.readouterr().err.strip()
    assert len(stderr.splitlines()) == 1 and "pm.nope" in stderr and "pm.l_acc.mean" in stderr
    assert not out.exists()


def test_runs_without_the_per_round_or_per_client_file_are_named(runs):
    (runs[2] / "clients.csv").unlink()
    with pytest.raises(ConfigError, match=rf"RUN_DIR: {runs[2]} has no clients\.csv"):
        clients_figure(plot_groups(runs))


def test_a_claim_report_draws_its_labels_over_their_seeds_with_the_same_figures(runs, tmp_path, monkeypatch):
    import pfl.runner.reproduce as rep

    figures = {}
    monkeypatch.setattr(rep, "save_figure", lambda fig, path: figures.update({path.name: fig}))
    labels = {"a0": "plain", "a1": "plain", "b0": "slow"}
    jobs = [Job("c", labels[r.name], SETTING[r.name][0], [], r, f"c/{labels[r.name]}") for r in runs]
    lines = comparison_plots("c", jobs, tmp_path, "Paper: c (held)")
    assert lines == [
        "![c curves](c_curves.png)",
        "",
        "![c clients](c_clients.png)",
        "",
    ]
    curves, clients = figures["c_curves.png"], figures["c_clients.png"]
    legend = [t.get_text() for t in curves.axes[0].get_legend().get_texts()]
    assert legend == ["plain (2 seeds)", "slow (1 seed)"]  # labelled as the claim's table rows
    assert curves.axes[0].get_title().startswith("Paper: c (held)\n")
    assert [sorted(d.get_ydata()) for d in drawn(clients, "clients")] == [
        sorted(CLIENTS["a0"] + CLIENTS["a1"]),
        sorted(CLIENTS["b0"]),
    ]
    RunFiles(runs[2]).write_metrics([{"round": 1, "train.loss": 1.0}])  # shares no accuracy with the others
    figures.clear()
    lines = comparison_plots("c", jobs, tmp_path, "t")
    assert lines[0].startswith("No curves plot: none of pm.l_acc.mean") and "missing in b0" in lines[0]
    assert list(figures) == ["c_clients.png"] and lines[2] == "![c clients](c_clients.png)"


def test_rounds_are_ticked_where_any_group_evaluated_and_colours_cycle(tmp_path):
    from pfl.metrics.compare_plots import group_color, shared_setting

    a = write_run(tmp_path, "a", 0, 0.1, {"pm.l_acc.mean": [0.1, 0.2, 0.3]}, [0.5])
    b = write_run(tmp_path, "b", 0, 0.05, {"pm.l_acc.mean": [0.1]}, [0.5])  # evaluated in round 1 only
    fig, _ = curve_figure(plot_groups([a, b]))
    assert list(fig.axes[0].get_xticks()) == [1, 2, 3]
    assert [group_color(i) for i in (0, 9, 10)] == ["C0", "C9", "C0"]  # matplotlib's ten colours, again
    (b / "config.yaml").unlink()  # described by its summary alone: no partition to name
    assert shared_setting(plot_groups([b])) == ""
    (a / "config.yaml").write_text("data: a text, not a group\n")
    assert shared_setting(plot_groups([a])) == ""


def _long_label_groups(tmp_path, n: int):
    from pfl.metrics.compare_plots import PlotGroup

    label = "fedprox, client.lr={i}, method.mu=0.00{i}, server.aggregator=trimmed_mean, data.alpha=0.{i}, "
    label += "model.norm=group"
    return [
        PlotGroup(label.format(i=i), [write_run(tmp_path, f"r{i}", 0, 0.1, CURVES["a0"], CLIENTS["a0"])])
        for i in range(n)
    ]


def _laid_out(fig):
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from pfl.metrics.plots import save_figure

    save_figure(fig, fig.test_path)  # lays it out as it is written
    return FigureCanvasAgg(fig).get_renderer()


def test_runs_that_differ_in_many_settings_get_a_legend_below_the_curves_inside_the_figure(runs, tmp_path):
    """A legend of long labels would spill past the figure's edge inside the axes: it goes under them, its
    labels broken at their spaces, and the figure grows by its lines; short labels stay where they were."""
    short, _ = curve_figure(plot_groups(runs))
    fig, _ = curve_figure(_long_label_groups(tmp_path, 4))
    assert tuple(short.get_size_inches()) == tuple(rcParams["figure.figsize"])
    for figure in (short, fig):
        figure.test_path = tmp_path / "f.png"
        renderer = _laid_out(figure)
        box, ax = figure.axes[0].get_legend().get_window_extent(renderer), figure.axes[0].get_window_extent(renderer)
        assert box.x0 >= 0 and box.x1 <= figure.bbox.width and box.y0 >= 0  # all of it on the figure
        assert bool(box.y1 < ax.y0) is (figure is fig)  # under the axes only when long
    texts = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert all("\n" in t for t in texts)  # broken at spaces, never inside a setting:
    labels = [f"{g.label} (1 seed)" for g in _long_label_groups(tmp_path / "x", 4)]
    assert [t.replace("\n", " ") for t in texts] == labels
    assert fig.get_size_inches()[1] > rcParams["figure.figsize"][1]


def test_the_client_figures_labels_of_long_settings_stay_apart(tmp_path):
    fig, _ = clients_figure(_long_label_groups(tmp_path, 3))
    fig.test_path = tmp_path / "k.png"
    renderer = _laid_out(fig)
    boxes = [t.get_window_extent(renderer) for t in fig.axes[0].get_xticklabels()]
    assert all(a.x1 < b.x0 for a, b in zip(boxes, boxes[1:], strict=False))  # side by side, not overlapping
    assert boxes[0].x0 >= 0 and boxes[-1].x1 <= fig.bbox.width
    assert "server.aggregator=trimmed_mean," in fig.axes[0].get_xticklabels()[0].get_text().split("\n")


def test_a_text_is_measured_as_it_is_drawn_and_the_figure_grows_by_the_legend_lines_below(tmp_path):
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from pfl.metrics.compare_plots import LEGEND_LINE_INCHES, text_inches
    from pfl.metrics.plots import new_figure

    fig, ax = new_figure((8.0, 2.0))
    text = ax.text(0, 0, "server.aggregator=trimmed_mean", fontsize="small")
    drawn_inches = text.get_window_extent(FigureCanvasAgg(fig).get_renderer()).width / fig.dpi
    assert text_inches(text.get_text()) == pytest.approx(drawn_inches, rel=0.003)
    fig, _ = curve_figure(_long_label_groups(tmp_path, 3))
    lines = sum(t.get_text().count("\n") + 1 for t in fig.axes[0].get_legend().get_texts())
    assert lines == 6  # two lines a label at the default width
    assert fig.get_size_inches()[1] == pytest.approx(rcParams["figure.figsize"][1] + LEGEND_LINE_INCHES * lines)


def test_labels_just_wider_than_a_box_widen_the_client_figure(tmp_path):
    from pfl.metrics.compare_plots import BOX_INCHES, PlotGroup, text_inches

    word = "x" * next(n for n in range(1, 200) if text_inches("x" * n) > BOX_INCHES - 0.1)  # one unbreakable setting
    groups = [
        PlotGroup(f"{word}{i}", [write_run(tmp_path, f"r{i}", 0, 0.1, CURVES["a0"], CLIENTS["a0"])]) for i in range(8)
    ]
    fig, _ = clients_figure(groups)
    fig.test_path = tmp_path / "k.png"
    renderer = _laid_out(fig)
    boxes = [t.get_window_extent(renderer) for t in fig.axes[0].get_xticklabels()]
    assert all(a.x1 < b.x0 for a, b in zip(boxes, boxes[1:], strict=False))
    assert fig.get_figwidth() > 8 * BOX_INCHES
