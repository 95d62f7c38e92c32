"""``python -m pfl data export|stats``, the npz round trip, and every conf/data file."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

import pfl.commands.data as data_command
from pfl.cli import main
from pfl.data import DataConfig, build_data
from pfl.errors import ConfigError
from pfl.runner.args import parse_fit_args

CONF = Path(__file__).resolve().parents[2] / "conf"
OVERRIDES = ["--data.num_clients", "8", "--data.val_frac", "0.1", "--data.new_clients", "0.25", "--seed", "3"]


def test_export_npz_round_trip_gives_the_same_split(tmp_path):
    out = tmp_path / "fed"
    assert (
        main(["data", "export", "--format", "npz", str(out), "--config", str(CONF / "default.yaml"), *OVERRIDES]) == 0
    )
    with open(out / "train" / "0.npz", "rb") as f:  # the PFLlib reader
        client0 = np.load(f, allow_pickle=True)["data"].tolist()
    assert set(client0) == {"x", "y"}
    assert sorted(int(p.stem) for p in (out / "test").glob("*.npz")) == list(range(8))
    config = json.loads((out / "config.json").read_text())
    assert config["num_clients"] == 8 and config["num_classes"] == 10 and config["new_clients"] == [6, 7]

    cfg, *_ = parse_fit_args(["--config", str(CONF / "default.yaml"), *OVERRIDES])
    original = build_data(cfg.data, cfg.seed)
    cfg.data.source, cfg.data.root = "npz_dir", str(out)
    loaded = build_data(cfg.data, seed=99)  # the split comes from the files, not the seed
    assert loaded.num_clients == original.num_clients == 6 and len(loaded.new_clients) == 2
    for a, b in zip([*original.clients, *original.new_clients], [*loaded.clients, *loaded.new_clients], strict=True):
        for split in ("train", "val", "test"):
            assert torch.equal(original.x[getattr(a, split)], loaded.x[getattr(b, split)])
            assert torch.equal(original.y[getattr(a, split)], loaded.y[getattr(b, split)])
    assert torch.equal(original.x[original.global_test], loaded.x[loaded.global_test])
    assert np.array_equal(client0["x"], original.x[original.clients[0].train].numpy())


def test_fit_trains_on_an_npz_dir(tmp_path):
    out = tmp_path / "fed"
    assert main(["data", "export", str(out), "--data.num_clients", "4"]) == 0
    args = ["--data.source", "npz_dir", "--data.root", str(out), "--data.num_clients", "4", "--trainer.rounds", "1"]
    common = ["--model.hidden", "[8]", "--tracking.wandb", "false", "--trainer.progress", "false"]
    assert main(["fit", *args, *common, "--tracking.root", str(tmp_path), "--tracking.name", "r"]) == 0
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["num_clients"] == 4
    assert main(["fit", *args[:-4], "--data.num_clients", "5", "--tracking.wandb", "false"]) == 2  # wrong count


def _clients(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_export_refuses_a_non_empty_folder_and_overwrite_replaces_it_whole(tmp_path, capsys):
    """Exporting 3 clients over 5 used to leave 3.npz and 4.npz, so 5 clients trained on two partitions."""
    out = tmp_path / "fed"
    assert main(["data", "export", str(out), "--data.num_clients", "5"]) == 0
    capsys.readouterr()
    assert main(["data", "export", str(out), "--data.num_clients", "3"]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"error: DIR: {out.resolve()} is not empty (it may hold another partition, and a mix of two trains "
        "silently) (pass --overwrite to replace it whole, or export to a new folder)\n"
    )
    assert _clients(out / "train") == [f"{i}.npz" for i in range(5)]  # untouched
    assert main(["data", "export", str(out), "--overwrite", "--data.num_clients", "3"]) == 0
    for split in ("train", "test"):
        assert _clients(out / split) == ["0.npz", "1.npz", "2.npz"]
    assert json.loads((out / "config.json").read_text())["num_clients"] == 3
    assert _clients(tmp_path) == ["fed"]  # no temporary sibling left
    assert build_data(DataConfig(source="npz_dir", root=str(out), num_clients=3), seed=0).num_clients == 3
    with pytest.raises(ConfigError):
        build_data(DataConfig(source="npz_dir", root=str(out), num_clients=5), seed=0)
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["data", "export", str(empty), "--data.num_clients", "2"]) == 0  # an empty folder is new
    assert _clients(empty / "train") == ["0.npz", "1.npz"]


def test_a_failed_overwrite_leaves_the_old_partition(tmp_path, monkeypatch):
    out = tmp_path / "fed"
    assert main(["data", "export", str(out), "--data.num_clients", "4"]) == 0
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}

    def disk_full(data, folder, extra):
        (folder / "train").mkdir()
        (folder / "train" / "0.npz").write_bytes(b"partial")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(data_command, "export_npz", disk_full)
    with pytest.raises(OSError):
        main(["data", "export", str(out), "--overwrite", "--data.num_clients", "3"])
    assert {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    assert _clients(tmp_path) == ["fed"]


def _tree(folder: Path) -> dict[str, bytes | None]:
    return {str(p.relative_to(folder)): p.read_bytes() if p.is_file() else None for p in folder.rglob("*")}


def _refused_overwrite(tmp_path: Path, capsys, folder: Path, expected: str) -> None:
    """``--overwrite`` onto ``folder`` exits 2 with one line holding ``expected``; nothing in or
    beside ``folder`` changes."""
    before, beside = _tree(folder), _clients(tmp_path)
    capsys.readouterr()
    assert main(["data", "export", str(folder), "--overwrite", "--data.num_clients", "3"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: DIR: ") and expected in err and len(err.strip().splitlines()) == 1, err
    assert _tree(folder) == before and _clients(tmp_path) == beside


def test_overwrite_refuses_a_folder_that_no_export_wrote(tmp_path, capsys):
    """A thesis folder passed by mistake used to be emptied and replaced with rc 0."""
    thesis = tmp_path / "thesis"
    (thesis / "src").mkdir(parents=True)
    (thesis / "thesis.tex").write_text("\\documentclass{article}")
    (thesis / "src" / "main.py").write_text("print('results')")
    _refused_overwrite(tmp_path, capsys, thesis, f"{thesis} has none, so it is left as it is")
    pfllib = tmp_path / "pfllib"  # the npz layout, but written by another tool: not ours to delete
    assert main(["data", "export", str(pfllib), "--data.num_clients", "3"]) == 0
    (pfllib / data_command.MARKER).unlink()
    _refused_overwrite(tmp_path, capsys, pfllib, f"(it holds {data_command.MARKER})")


@pytest.mark.parametrize("extra", ["notes.txt", "train/notes.txt", "train/5.npz/", "test/link.npz", "src/"])
def test_overwrite_refuses_an_export_that_holds_other_files(tmp_path, capsys, extra):
    out = tmp_path / "fed"
    assert main(["data", "export", str(out), "--data.num_clients", "4"]) == 0
    path = out / extra.rstrip("/")
    if extra.endswith("/"):
        path.mkdir()
    elif "link" in extra:
        path.symlink_to(tmp_path / "elsewhere.npz")
    else:
        path.write_text("mine")
    _refused_overwrite(tmp_path, capsys, out, f"files an export does not write ({extra})")


@pytest.mark.parametrize("command", ["export", "stats"])
def test_data_commands_print_their_own_usage(command, capsys):
    assert main(["data", command, "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: python -m pfl data {command} ") and "python -m pfl fit [" not in out


def test_stats_prints_sizes_histograms_and_writes_heatmap(tmp_path, capsys):
    plot = tmp_path / "h.png"
    args = ["data", "stats", "--json", "--plot", str(plot), "--data.partition", "pathological", *OVERRIDES]
    assert main(args) == 0
    report = json.loads(capsys.readouterr().out)
    assert len(report["clients"]) == 6 and len(report["new_clients"]) == 2
    row = report["clients"][0]
    assert {"train", "val", "test", "labels"} <= set(row) and sum(row["labels"]) == row["train"] + row["val"] + row[
        "test"
    ]
    assert all(sum(1 for v in r["labels"] if v) == 2 for r in report["clients"])
    assert report["summary"]["classes_per_client_mean"] == 2.0
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(["data", "stats", "--data.partition", "nope"]) == 2


@pytest.mark.parametrize("command", ["stats", "export"])
def test_an_unknown_option_is_refused_naming_the_data_command(command, tmp_path, capsys):
    args = ["data", command, *([str(tmp_path / "out")] if command == "export" else []), "--nope", "1"]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: data {command}: nope: unrecognized option") and "\n" not in err


def test_stats_table_has_a_row_per_client_matching_the_json(capsys):
    args = ["data", "stats", "--data.partition", "dirichlet", "--data.alpha", "0.3", *OVERRIDES]
    assert main([*args, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert main(args) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "digits: 6 clients + 2 new (marked *), 10 classes, input 1x8x8"
    assert lines[1].split() == ["client", "train", "val", "test", "classes", "entropy", "dominant"]
    table = [line.split() for line in lines[3 : lines.index("")] if not line.startswith("-")]  # rules part the new
    assert [row[0] for row in table] == ["0", "1", "2", "3", "4", "5", "6*", "7*"]
    for row, client in zip(table, report["clients"] + report["new_clients"], strict=True):
        counts = np.asarray(client["labels"], dtype=float)
        p = counts[counts > 0] / counts.sum()
        expected = [client["train"], client["val"], client["test"], len(p), -(p * np.log(p)).sum(), p.max()]
        assert [float(c) for c in row[1:]] == pytest.approx(expected, abs=5e-3)
    summary = report["summary"]
    assert (
        f"label entropy {summary['label_entropy_mean']:.3f} nats on average ({np.log(10):.3f} when balanced)"
        in (lines[-1])
    )
    assert lines[-3].startswith(f"summary: {summary['samples']} samples in all, {summary['global_test']} of them")


def test_client_label_stats_on_balanced_and_single_class_clients():
    from pfl.data.stats import client_label_stats

    assert client_label_stats([5, 5, 5, 5, 0]) == (4, pytest.approx(np.log(4)), 0.25)
    assert client_label_stats([0, 7, 0]) == (1, 0.0, 1.0)


EMBEDDED = ["digits_pat2", "digits_dir03", "digits_page", "digits_new_clients", "mnist5k_pat2", "mnist5k_dir03",
            "rotated_mnist5k_36", "rotated_mnist5k_36_big", "rotated_mnist5k_12", "rotated_mnist5k_12_big",
            "synthetic_page", "shakespeare_roles", "digits_dir05",
            "synthetic_1_1", "synthetic_regression"]  # fmt: skip


@pytest.mark.parametrize("path", sorted((CONF / "data").glob("*.yaml")), ids=lambda p: p.stem)
def test_every_data_config_parses_and_embedded_ones_build(path):
    cfg, *_ = parse_fit_args(["--config", str(CONF / "default.yaml"), "--config", str(path)])
    assert cfg.model.name in ("mlp", "cnn", "logreg", "char_lstm")
    if path.stem in EMBEDDED:
        data = build_data(cfg.data, cfg.seed)
        assert data.num_clients + len(data.new_clients) == cfg.data.num_clients
    else:
        assert cfg.data.root is not None  # a paper setting on disk


def test_paper_settings_each_have_an_embedded_analogue():
    names = {p.stem for p in (CONF / "data").glob("*.yaml")}
    assert set(EMBEDDED) <= names
    for stem in names - set(EMBEDDED):
        text = (CONF / "data" / f"{stem}.yaml").read_text().lower()
        analogue = text.split("analogue:")[1].split()[0].rstrip(".") if "analogue:" in text else None
        assert analogue is None or analogue in EMBEDDED, stem
        assert analogue is not None, f"{stem} names no offline analogue"


def test_embedded_config_runs_through_fit(tmp_path):
    args = ["fit", "--config", str(CONF / "default.yaml"), "--config", str(CONF / "data" / "rotated_mnist5k_36.yaml")]
    tiny = ["--trainer.rounds", "1", "--trainer.fraction", "0.1", "--client.epochs", "1", "--model.hidden", "[16]"]
    out = ["--tracking.wandb", "false", "--trainer.progress", "false", "--tracking.root", str(tmp_path)]
    assert main([*args, *tiny, *out, "--tracking.name", "r"]) == 0
    assert json.loads((tmp_path / "r" / "summary.json").read_text())["num_clients"] == 36
