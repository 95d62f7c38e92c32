"""The run's figures: curves per metric family, the per-client histogram and the personalized vs
LOCAL scatter. Each is checked on the figure itself (captured before it is saved) and as a PNG."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib.image
import numpy as np
import pytest

import pfl.metrics.plots as plots
from pfl.metrics.protocols import reference_metrics


@pytest.fixture
def captured(monkeypatch):
    """The figures the plot functions build, kept instead of saved."""
    figures = []
    monkeypatch.setattr(plots, "save_figure", lambda fig, path, dpi=100: figures.append(fig))
    return figures


def history(rounds: int = 5) -> list[dict]:
    out = []
    for r in range(1, rounds + 1):
        out.append(
            {
                "round": r,
                "pm.l_acc.mean": 0.5 + 0.05 * r,
                "pm.l_acc.std": 0.1,
                "gm.acc": 0.4 + 0.04 * r,
                "pm.l_loss.mean": 2.0 - 0.2 * r,
                "pm.l_loss.std": 0.3,
                "gm.loss": 2.1 - 0.25 * r,
                "train.loss": 1.9 - 0.3 * r,
                "ptr": 0.1 * r,
                "comm.up_bytes.total": 100.0 * r,
            }
        )
    return out


def assert_png_is_a_picture(path: Path) -> None:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    pixels = matplotlib.image.imread(path)[..., :3].reshape(-1, 3)
    assert len(np.unique(pixels, axis=0)) > 50  # lines, text, colours: not a blank canvas
    assert (pixels < 0.99).any(axis=1).mean() > 0.02


def test_curves_have_one_labelled_panel_per_family_and_a_title(tmp_path, captured):
    keys = plots.plot_curves(history(), tmp_path / "curves.png", title="fedavg on digits")
    assert keys == ["pm.l_acc.mean", "gm.acc", "train.loss", "pm.l_loss.mean", "gm.loss", "ptr"]
    (fig,) = captured
    axes = [ax for ax in fig.axes if ax.get_visible()]
    assert [ax.get_title() for ax in axes] == ["accuracy", "loss", "against LOCAL"]
    assert all(ax.get_xlabel() == "round" for ax in axes) and axes[1].get_ylabel() == "loss"
    assert fig._suptitle.get_text() == "fedavg on digits"
    loss_legend = [t.get_text() for t in axes[1].get_legend().get_texts()]
    assert loss_legend == ["training", "P-models, own test", "global model, global test"]
    acc_lines = {line.get_label(): line for line in axes[0].get_lines()}
    assert list(acc_lines["P-models, own test (L-acc)"].get_ydata()) == [h["pm.l_acc.mean"] for h in history()]
    assert "± std over clients" in [t.get_text() for t in axes[0].get_legend().get_texts()]
    (band,) = axes[0].collections  # the shaded mean ± std over clients of the own-test accuracy
    ys = band.get_paths()[0].vertices[:, 1]
    assert (ys.min(), ys.max()) == pytest.approx((0.55 - 0.1, 0.75 + 0.1))


def test_curves_take_their_title_from_the_run_summary_and_draw_new_losses(tmp_path, captured):
    (tmp_path / "summary.json").write_text(json.dumps({"method": "ditto", "dataset": "digits", "seed": 3}))
    rows = [{"round": 1, "pm.l_acc.mean": 0.5, "val.loss": 1.0}, {"round": 2, "pm.l_acc.mean": 0.6, "val.loss": 0.9}]
    assert plots.plot_curves(rows, tmp_path / "curves.png") == ["pm.l_acc.mean", "val.loss"]
    assert captured[0]._suptitle.get_text() == "ditto on digits (seed 3)"


def test_curves_png_is_written(tmp_path):
    path = tmp_path / "curves.png"
    plots.plot_curves(history(), path, title="fedavg on digits")
    assert_png_is_a_picture(path)


ROWS = [
    {"client": k, "pm.l_acc": p, "gm.l_acc": g, "ref.pm.l_acc": r}
    for k, (p, g, r) in enumerate(
        [(0.9, 0.7, 0.8), (0.6, 0.6, 0.6), (0.5, 0.65, 0.7), (1.0, 0.8, 0.95), (0.75, 0.7, 0.9)]
    )
]  # client 1 ties LOCAL (a pass); clients 2 and 4 fall below


def test_histogram_bars_share_edges_count_every_client_and_show_means(tmp_path, captured):
    drawn = plots.plot_client_histogram(ROWS, tmp_path / "h.png", ("pm.l_acc", "gm.l_acc", "gm.l_mae"), title="t")
    assert drawn == ["pm.l_acc", "gm.l_acc"]
    (fig,) = captured
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == ["P-model accuracy, own test (mean 0.750)", "global model accuracy, own test (mean 0.690)"]
    bars = {
        container[0].get_label(): list(container) for container in ax.containers
    }  # a series' label is on its first bar
    for label in labels:  # every client is counted once in each series
        assert sum(b.get_height() for b in bars[label]) == len(ROWS)
    pm_left = [b.get_x() for b in bars[labels[0]]]
    gm_left = [b.get_x() for b in bars[labels[1]]]
    assert all(g > p for p, g in zip(pm_left, gm_left, strict=True))  # side by side in each shared bin
    assert ax.get_xlabel() == "accuracy per client" and ax.get_ylabel() == "clients"
    means = sorted(line.get_xdata()[0] for line in ax.get_lines())
    assert means == pytest.approx([0.69, 0.75])


def test_histogram_png_is_written(tmp_path):
    path = tmp_path / "clients_hist.png"
    plots.plot_client_histogram(ROWS, path, ("pm.l_acc", "gm.l_acc"), title="fedavg on digits")
    assert_png_is_a_picture(path)


def test_scatter_marks_the_diagonal_and_reports_ptr_with_ties_passing(tmp_path, captured):
    out = plots.plot_client_scatter(ROWS, tmp_path / "s.png", title="ditto on digits")
    own = [r["pm.l_acc"] for r in ROWS]
    ref = [r["ref.pm.l_acc"] for r in ROWS]
    assert out["ptr"] == reference_metrics(own, ref)["ptr"] == pytest.approx(3 / 5)
    assert out["gain.mean"] == pytest.approx(np.mean(np.subtract(own, ref)))
    ax = captured[0].axes[0]
    assert ax.get_title() == "ditto on digits\nPTR = 0.60 (3/5), mean gain -0.040"
    assert ax.get_xlabel() == "LOCAL accuracy, own test" and ax.get_ylabel() == "P-model accuracy, own test"
    diagonal = [line for line in ax.get_lines() if list(line.get_xdata()) == list(line.get_ydata())]
    assert len(diagonal) == 1
    passed, failed = ax.collections[1:]  # after the shaded pass region
    assert sorted(map(tuple, passed.get_offsets())) == [(0.6, 0.6), (0.8, 0.9), (0.95, 1.0)]  # (LOCAL, own)
    assert len(failed.get_offsets()) == 2


def test_scatter_on_mae_passes_below_the_diagonal(tmp_path, captured):
    rows = [{"pm.mae": 0.2, "ref.pm.mae": 0.3}, {"pm.mae": 0.4, "ref.pm.mae": 0.3}]
    out = plots.plot_client_scatter(rows, tmp_path / "s.png", "pm.mae", "ref.pm.mae")
    assert out["ptr"] == 0.5
    passed = captured[0].axes[0].collections[1]
    assert [tuple(p) for p in passed.get_offsets()] == [(0.3, 0.2)]


def test_scatter_without_reference_scores_writes_nothing(tmp_path):
    path = tmp_path / "s.png"
    assert plots.plot_client_scatter([{"pm.l_acc": 0.5}], path) is None
    assert not path.exists()


def test_scatter_png_is_written(tmp_path):
    path = tmp_path / "clients_vs_local.png"
    plots.plot_client_scatter(ROWS, path, title="ditto on digits")
    assert_png_is_a_picture(path)


def test_a_series_keeps_its_colour_in_every_panel_and_rounds_are_ticked_where_evaluated(tmp_path, captured):
    rows = [{**row, "round": 2 * row["round"]} for row in history()]  # evaluated every 2 rounds
    plots.plot_curves(rows, tmp_path / "curves.png")
    accuracy, loss, local = [ax for ax in captured[0].axes if ax.get_visible()]
    colour = {
        ax.get_title(): {line.get_label(): line.get_color() for line in ax.get_lines()} for ax in captured[0].axes
    }
    assert colour["accuracy"]["P-models, own test (L-acc)"] == colour["loss"]["P-models, own test"] == "C0"
    assert colour["accuracy"]["global model, global test"] == colour["loss"]["global model, global test"] == "C1"
    assert len({*colour["loss"].values()}) == 3  # the panel's own series told apart
    for ax in (accuracy, loss, local):
        assert list(ax.get_xticks()) == [2, 4, 6, 8, 10]
    many = [{"round": 5 * r, "gm.acc": 0.5} for r in range(1, 32)]  # 31 evaluations
    plots.plot_curves(many, tmp_path / "many.png")
    ticks = list(captured[1].axes[0].get_xticks())
    assert len(ticks) <= plots.MAX_ROUND_TICKS and ticks[-1] == 155  # the reported round is ticked
    assert all(t % 5 == 0 for t in ticks) and len(set(np.diff(ticks))) == 1  # evaluated rounds, evenly


def test_a_run_title_names_the_partition_from_the_config(tmp_path, captured):
    (tmp_path / "summary.json").write_text(json.dumps({"method": "ditto", "dataset": "digits", "seed": 3}))
    (tmp_path / "config.yaml").write_text(
        "data:\n  source: digits\n  partition: pathological\n  classes_per_client: 2\n"
    )
    plots.plot_curves(history(), tmp_path / "curves.png")
    assert captured[0]._suptitle.get_text() == "ditto on digits, pathological, 2 classes per client (seed 3)"
    assert plots.data_setting({"partition": "dirichlet", "alpha": 0.3}) == "Dirichlet α=0.3"
    assert plots.data_setting({"partition": "iid"}) == "IID"
    assert plots.data_setting({"source": "shakespeare", "partition": "dirichlet"}) == ""  # its own clients


def test_the_data_heatmap_names_its_partition_and_labels_every_client(tmp_path, captured):
    from types import SimpleNamespace

    from pfl.data import DataConfig, build_data

    data = build_data(DataConfig(source="digits", num_clients=6, partition="pathological", min_samples=5), 0)
    plots.plot_heatmap(data, tmp_path / "h.png", "pathological, 2 classes per client")
    ax = captured[0].axes[0]
    assert ax.get_title() == "digits, pathological, 2 classes per client\nsamples per client and class"
    assert [t.get_text() for t in ax.get_yticklabels()] == ["0", "1", "2", "3", "4", "5"]
    held = SimpleNamespace(num_clients=2, new_clients=[object()], client_names=["ROMEO", "JULIET", "NURSE"])
    assert plots.client_rows(held) == ["0 ROMEO", "1 JULIET", "new 0 NURSE"]
    many = SimpleNamespace(num_clients=130, new_clients=[], client_names=[])
    assert plots.client_rows(many)[:2] == ["0", "1"] and len(plots.client_rows(many)) == 130
