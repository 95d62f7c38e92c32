"""`python -m pfl report`: its options reach the table; --plot/--plot-clients write the figures, checked
before anything is read, and stdout stays the table."""

from __future__ import annotations

import json

import pytest

from pfl.cli import main
from pfl.metrics.report import report
from tests.helpers.report_plots import drawn
from tests.helpers.reports import two_methods_three_seeds


def test_the_command_passes_its_options_to_the_table(tmp_path, capsys):
    runs = [str(r) for r in two_methods_three_seeds(tmp_path)]
    assert main(["report", *runs, "--metrics", " rounds_to_target, ,"]) == 0
    assert capsys.readouterr().out == report(runs, ["rounds_to_target"], digits=4)  # not every measured key
    assert main(["report", *runs, "--per-run", "--format", "csv", "--digits", "2"]) == 0
    assert capsys.readouterr().out == report(runs, None, "csv", group=False, digits=2)
    assert main(["report", *runs, "--per-run"]) == 0
    out = capsys.readouterr().out
    assert out == report(runs, group=False) and "| 0.7000 (0.0500) |" in out  # four decimals by default


def test_runs_of_different_platforms_get_a_note_on_stderr_and_the_table_is_unchanged(tmp_path, capsys):
    runs = two_methods_three_seeds(tmp_path)
    assert main(["report", *map(str, runs)]) == 0
    table, err = capsys.readouterr()
    assert "note:" not in err  # no run records a platform: one (unrecorded) platform
    amd = {"torch": "2.14.1", "cpu": "AMD EPYC", "cpu_kernels": "AVX2", "threads": 1}
    for i, run in enumerate(runs):
        path = run / "summary.json"
        platform = amd if i else {**amd, "cpu_kernels": "AVX512"}
        path.write_text(json.dumps({**json.loads(path.read_text()), "platform": platform}))
    assert main(["report", *map(str, runs)]) == 0
    out, err = capsys.readouterr()
    assert out == table
    assert err.startswith(
        "note: Numbers computed on 2 platforms "
        f"(torch 2.14.1, AMD EPYC (AVX2 kernels, 1 thread): {len(runs) - 1} run(s); "
    )
    assert main(["report", *map(str, runs[1:])]) == 0
    assert "note:" not in capsys.readouterr().err  # one platform: said nowhere


def test_report_writes_both_figures_and_prints_the_same_table(runs, tmp_path, capsys):
    curves, clients = tmp_path / "figs" / "curves.png", tmp_path / "figs" / "clients.pdf"
    assert main(["report", *map(str, runs)]) == 0
    table = capsys.readouterr().out
    assert main(["report", *map(str, runs), "--plot", str(curves), "--plot-clients", str(clients)]) == 0
    out = capsys.readouterr()
    assert out.out == table  # stdout stays the table
    assert curves.read_bytes().startswith(b"\x89PNG") and clients.read_bytes().startswith(b"%PDF")
    assert f"wrote {curves}" in out.err and f"wrote {clients}" in out.err


def test_the_command_groups_the_figures_as_it_groups_the_table(runs, tmp_path, monkeypatch, capsys):
    import pfl.commands.report as command

    figures = {}
    monkeypatch.setattr(command, "save_figure", lambda fig, path: figures.update({path.name: fig}))
    for per_run, rows in (([], 2), (["--per-run"], 3)):
        plot = ["--plot", str(tmp_path / "c.png"), "--plot-clients", str(tmp_path / "k.png")]
        assert main(["report", *map(str, runs), *per_run, *plot]) == 0
        assert len(capsys.readouterr().out.splitlines()) == 2 + rows
        assert len(drawn(figures["c.png"], "mean")) == rows and len(drawn(figures["k.png"], "boxes")) == rows
    assert main(["report", *map(str, runs), "--plot-clients", str(tmp_path / "only.png")]) == 0
    assert list(figures) == ["c.png", "k.png", "only.png"]  # each figure only when asked for


def test_a_bad_option_prints_the_usage_with_the_figure_options(capsys):
    assert main(["report", "--plot"]) == 2
    err = capsys.readouterr().err
    assert "--plot: expected one argument" in err
    assert "usage: python -m pfl report RUN_DIR [RUN_DIR ...]" in err and "[--plot FILE.png [--plot-metric KEY]]" in err


@pytest.mark.parametrize(
    "args, message",
    [
        (["--plot", "{tmp}/c.txt"], "--plot: {tmp}/c.txt has no image suffix"),
        (["--plot-clients", "{tmp}"], "--plot-clients: {tmp} has no image suffix"),
        (["--plot", "{tmp}/dir.png"], "--plot: {tmp}/dir.png is a folder"),
        (["--plot", "{tmp}/file/c.png"], "--plot: cannot write {tmp}/file/c.png: {tmp}/file is not a writable folder"),
        (["--plot", "{tmp}/c.png", "--plot-clients", "{tmp}/c.png"], "--plot-clients: {tmp}/c.png is also the --plot"),
        (["--plot-metric", "gm.acc"], "--plot-metric: chooses what --plot draws (add --plot FILE.png)"),
    ],
)
def test_bad_figure_options_are_refused_before_anything_is_read(tmp_path, capsys, args, message):
    (tmp_path / "dir.png").mkdir()
    (tmp_path / "file").write_text("keep")
    missing = tmp_path / "no-such-run"  # checked after the figure options: their error comes first
    assert main(["report", str(missing), *(a.format(tmp=tmp_path) for a in args)]) == 2
    err = capsys.readouterr().err.strip()
    assert message.format(tmp=tmp_path) in err and len(err.splitlines()) == 1
    assert (tmp_path / "file").read_text() == "keep" and sorted(p.name for p in tmp_path.iterdir()) == [
        "dir.png",
        "file",
    ]
