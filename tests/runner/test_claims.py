"""Tests of pfl/runner/claims: the verdict rule (held / not held / tie over seeds, beyond a margin), the
per-seed paired differences, and each paper's claim comparing what its table compares."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import yaml

from pfl.errors import ConfigError
from pfl.runner.claims import (
    Claim,
    Contrast,
    LrGrid,
    above,
    all_claims,
    beats,
    claim_verdict,
    client_pairs,
    client_scores,
    method_args,
    only_runs,
    paired,
    seed_mean,
    standing,
    verdict,
    verdict_text,
)

ROOT = Path(__file__).resolve().parents[2]


# -- a partial claim (--runs) --------------------------------------------------------------------------
def test_only_runs_keeps_those_labels_and_the_contrasts_with_a_result():
    runs = {"a": method_args("fedavg"), "b": method_args("local"), "c": method_args("ditto")}
    claim = Claim("k", "P", "a beats b and c", [], runs, beats("a", ["b", "c"], "acc"), winner="a")
    part = only_runs(claim, ["c", "a", "z"])
    assert part.runs == {"a": runs["a"], "c": runs["c"]} and part.partial and not claim.partial
    assert (part.key, part.winner, list(claim.runs)) == ("k", "a", ["a", "b", "c"])  # the claim itself unchanged
    s = {seed: {"a": {"metrics": {"acc": 0.9}}, "c": {"metrics": {"acc": 0.7 + seed / 10}}} for seed in (0, 1)}
    assert [(c.name, c.diffs) for c in part.contrasts(s)] == [("a - c (acc)", pytest.approx({0: 0.2, 1: 0.1}))]
    assert [c.name for c in claim.contrasts(s)] == ["a - b (acc)", "a - c (acc)"]  # whole: every contrast
    assert only_runs(claim, ["z"]) is None
    assert only_runs(claim, iter(["c", "a"])).runs == part.runs  # labels read once, a one-pass iterator too


# -- verdicts -------------------------------------------------------------------------------------
def test_verdict_held_when_every_seed_favours_the_claim_beyond_the_spread():
    assert verdict(Contrast("a - b", {0: 0.05, 1: 0.04, 2: 0.06})) == "held"


def test_verdict_tie_when_the_mean_is_within_the_seed_spread():
    assert verdict(Contrast("a - b", {0: 0.05, 1: -0.04, 2: 0.02})) == "tie"
    # positive mean beyond the spread but one seed against the claim: not held, not a win either
    assert verdict(Contrast("a - b", {0: 0.30, 1: 0.30, 2: 0.30, 3: -0.01})) == "tie"


def test_verdict_not_held_when_the_mean_is_against_the_claim_beyond_the_spread():
    assert verdict(Contrast("a - b", {0: -0.05, 1: -0.04, 2: -0.06})) == "not held"
    assert verdict(Contrast("a - b", {0: -0.30, 1: -0.30, 2: 0.01})) == "not held"


def test_verdict_measures_the_difference_beyond_the_margin():
    diffs = {0: 0.05, 1: 0.04, 2: 0.06}
    assert verdict(Contrast("a - b", diffs, margin=0.0)) == "held"
    assert verdict(Contrast("a - b", diffs, margin=0.05)) == "tie"
    assert verdict(Contrast("a - b", diffs, margin=0.2)) == "not held"
    assert verdict(Contrast("a - b", {0: -0.01, 1: -0.015, 2: -0.012}, margin=-0.02)) == "held"  # may drop 2 points


def test_one_seed_decides_by_sign_and_is_marked_indicative():
    assert verdict(Contrast("a - b", {0: 0.01})) == "held"
    assert verdict(Contrast("a - b", {0: -0.01})) == "not held"
    assert verdict(Contrast("a - b", {0: 0.0})) == "tie"
    assert verdict_text(Contrast("a - b", {0: 0.01})) == "held (indicative, 1 seed)"
    assert verdict_text(Contrast("a - b", {0: 0.01, 1: 0.02})) == "held"


def test_held_needs_the_mean_strictly_above_the_spread_and_every_seed_strictly_positive():
    # 2, 4, 15: mean 7 and sample std sqrt((25 + 9 + 64) / 2) = 7 exactly
    assert verdict(Contrast("a - b", {0: 2.0, 1: 4.0, 2: 15.0})) == "tie"
    assert verdict(Contrast("a - b", {0: -2.0, 1: -4.0, 2: -15.0})) == "tie"
    # mean 2/3 above the std 0.577, but one seed shows no gain at all
    assert verdict(Contrast("a - b", {0: 0.0, 1: 1.0, 2: 1.0})) == "tie"


def test_two_seeds_have_a_spread():
    contrast = Contrast("a - b", {0: 0.01, 1: 0.5})  # mean 0.255 within the std 0.346
    assert contrast.spread == pytest.approx(0.49 / 2**0.5) and verdict(contrast) == "tie"


def test_verdict_of_no_or_non_finite_differences_is_a_tie():
    assert verdict(Contrast("a - b", {})) == "tie"
    assert verdict(Contrast("a - b", {0: float("nan"), 1: 0.3, 2: 0.3})) == "tie"


def test_claim_verdict_needs_every_contrast_held_and_any_not_held_fails_it():
    held = Contrast("h", {0: 0.1, 1: 0.1})
    tie = Contrast("t", {0: 0.1, 1: -0.1})
    lost = Contrast("n", {0: -0.1, 1: -0.1})
    assert claim_verdict([held, held]) == "held"
    assert claim_verdict([held, tie]) == "tie"
    assert claim_verdict([held, tie, lost]) == "not held"
    assert claim_verdict([]) == "tie"


def test_paired_and_above_give_per_seed_differences_of_the_runs_present():
    s = {
        0: {"a": {"metrics": {"m.mean": 0.8}}, "b": {"metrics": {"m.mean": 0.5}}},
        1: {"a": {"metrics": {"m.mean": 0.6}}},  # b failed on seed 1: no pair
    }
    assert paired(s, "a", "b", "m") == {0: pytest.approx(0.3)}
    assert above(s, "a", "m", 0.5) == {0: pytest.approx(0.3), 1: pytest.approx(0.1)}
    (c,) = beats("a", ["b"], "m", margin=0.1)(s)
    assert c.diffs == {0: pytest.approx(0.3)} and c.margin == 0.1 and "a - b" in c.name


# -- the paper claims' checks on hand-made summaries ----------------------------------------------------
def _seeds(rows: dict[str, tuple[float, ...]], key: str) -> dict:
    n = len(next(iter(rows.values())))
    return {seed: {label: {"metrics": {key: v[seed]}} for label, v in rows.items()} for seed in range(n)}


def test_standing_ranks_the_winner_and_names_the_runs_ahead():
    s = _seeds({"w": (0.8, 0.82), "a": (0.9, 0.88), "b": (0.5, 0.5)}, "m")
    (sentence,) = standing("w", "m")(s)
    assert sentence == "m (mean over seeds): w 0.8100 ranks 2 of 3; at or above it: a 0.8900."


def test_standing_counts_ties_as_ahead_lists_the_best_first_and_averages_the_seeds_a_run_finished():
    s = _seeds({"w": (0.6, 0.6), "tie": (0.6, 0.6), "best": (0.9, 0.7), "low": (0.1, 0.1)}, "m")
    del s[1]["best"]  # best finished on seed 0 only: its mean is over that seed
    (sentence,) = standing("w", "m")(s)
    assert sentence == "m (mean over seeds): w 0.6000 ranks 3 of 4; at or above it: best 0.9000, tie 0.6000."
    (first,) = standing("best", "m")(s)
    assert first == "m (mean over seeds): best 0.9000 ranks 1 of 4; at or above it: none."
    assert standing("absent", "m")(s) == ["absent has no finished run."]


def test_beats_contrasts_every_baseline_with_no_margin_by_default():
    s = _seeds({"w": (0.8, 0.7), "a": (0.5, 0.6), "b": (0.9, 0.9)}, "m")
    check = beats("w", (b for b in ("a", "b")), "m")  # a one-pass iterable: every call sees both baselines
    assert [c.name for c in check(s)] == [c.name for c in check(s)]
    contrasts = check(s)
    assert [(c.name, c.margin) for c in contrasts] == [("w - a (m)", 0.0), ("w - b (m)", 0.0)]
    assert contrasts[1].diffs == {0: pytest.approx(-0.1), 1: pytest.approx(-0.2)}


def test_page_compares_what_table_1_compares_with_both_controls():
    from pfl.runner.claims import page

    labels = [*page.PAGE_BASELINES, "page", *page.CONTROLS]
    assert set(page.CLAIMS[0].runs) == set(labels)
    s = {0: {k: {"metrics": {"pm.l_acc.mean": 0.5, "gm.acc": 0.5}} for k in labels}}
    names = [c.name for c in page.page_contrasts(s)]
    assert "page - scaffold (pm.l_acc)" in names and "page - scaffold (gm.acc)" not in names  # higher in the paper
    assert (
        "page - feddyn (gm.acc)" not in names and "page - dapfl (gm.acc)" in names and "page - ditto (gm.acc)" in names
    )
    assert "page - page_fixed (control, pm.l_acc)" in names and "page - page_random (control, gm.acc)" in names
    # Table 1's rows on Synthetic, FedRecon's aside (none there, "/"); SCAFFOLD and FedDyn on pm.l_acc only
    personal = ["fedavg", "fedprox", "scaffold", "feddyn", "dapfl", "pfedme", "ditto", "fedala", "fedrod"]
    assert {n for n in names if n.endswith("(pm.l_acc)")} == {f"page - {b} (pm.l_acc)" for b in personal}
    glob = {f"page - {b} (gm.acc)" for b in personal if b not in ("scaffold", "feddyn")}
    assert {n for n in names if n.endswith("(gm.acc)") and "control" not in n} == glob
    argv = page.CLAIMS[0].runs["page_random"]
    assert argv[argv.index("--method.actions") + 1] == "random"


def test_page_warmup_is_under_a_tenth_of_the_run(monkeypatch):
    monkeypatch.chdir(ROOT)
    from pfl.runner.args import parse_fit_args
    from pfl.runner.claims import page

    claim = page.CLAIMS[0]
    cfg = parse_fit_args([*claim.base, *claim.runs["page"]])[0]
    assert cfg.trainer.rounds >= 300 and cfg.method.warmup < cfg.trainer.rounds / 10


def test_page_notes_flag_agents_tuned_on_the_test_set(tmp_path):
    from pfl.runner.claims import page

    runs = {}
    for label, split in (("page", "validation"), ("page_test", "test"), ("fedavg", None)):
        (tmp_path / label).mkdir()
        method = {"name": "page", "reward_split": split} if split else {"name": "fedavg"}
        (tmp_path / label / "config.yaml").write_text(yaml.safe_dump({"method": method}))
        runs[label] = {"run_dir": str(tmp_path / label)}
    (note,) = page.reward_split_notes({0: runs})
    assert note.startswith("**Warning**: page_test used method.reward_split test")
    del runs["page_test"]
    assert "validation" in page.reward_split_notes({0: runs})[0]


def test_pgfed_is_contrasted_with_every_baseline_not_with_its_own_variants():
    from pfl.runner.claims import pgfed

    claim = pgfed.CLAIMS[0]
    s = _seeds({label: (0.5, 0.6) for label in claim.runs}, "pm.l_acc.mean")
    names = [c.name for c in claim.contrasts(s)]
    assert len(names) == len(claim.runs) - 3 and not any("pgfedmo" in n or "pgfed_ce" in n for n in names)
    assert "pgfed - fedavg (pm.l_acc.mean)" in names


# -- the claim records ------------------------------------------------------------------------------------
def test_a_claims_methods_are_the_method_names_of_its_runs():
    runs = {"p": method_args("page", "--method.warmup", "3"), "f": method_args("fedavg"), "d": ["--seed", "1"]}
    claim = Claim("k", "paper", "statement", [], runs, beats("p", ["f"], "m"))
    assert claim.methods() == {"page", "fedavg"}


def test_an_lr_grid_applies_to_its_labels_or_to_every_run_when_it_names_none():
    assert LrGrid((0.1,)).applies("anything")
    named = LrGrid((0.1,), labels=("fedavg",))
    assert named.applies("fedavg") and not named.applies("ditto")


def test_all_claims_are_every_paper_modules_claims_in_module_order():
    from pfl.runner.claims import fedora, fedpg, page, pgfed, plgu

    expected = [*fedora.CLAIMS, *fedpg.CLAIMS, *page.CLAIMS, *pgfed.CLAIMS, *plgu.CLAIMS]
    assert [c.key for c in all_claims()] == [c.key for c in expected]
    assert len({c.key for c in expected}) == len(expected) == 7


def test_claims_run_three_seeds_and_add_nothing_unless_they_say_so():
    claim = Claim("k", "paper", "statement", [], {"p": method_args("page")}, beats("p", [], "m"))
    assert claim.seeds == (0, 1, 2)  # >= 3 seeds: a verdict weighs a difference against its spread
    # the report runs a stage or prints a section only for what is set (it checks "is not None")
    assert (claim.winner, claim.diagnose, claim.lr_grid, claim.notes) == (None, None, None, None)
    assert claim.plot_metric == "pm.l_acc.mean" and claim.metrics[:3] == (
        "pm.l_acc",
        "pm.l_acc.top5",
        "pm.l_acc.bottom5",
    )


def test_the_lr_grid_defaults_are_the_documented_ones():
    grid = LrGrid((0.1,))
    documented = f'LrGrid(values, labels={grid.labels}, rounds={grid.rounds}, metric="{grid.metric}")'
    assert documented in " ".join((ROOT / "docs" / "reproduce.md").read_text().split())
    assert grid.arg == "--client.lr"  # the grid's values are client learning rates


def test_contrasts_and_lr_grids_are_values():
    import dataclasses

    with pytest.raises(dataclasses.FrozenInstanceError):
        Contrast("a - b", {0: 0.1}).margin = 0.5  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        LrGrid((0.1,)).rounds = 5  # type: ignore[misc]


# -- what the suite runs, against what the docs say it runs --------------------------------------------------
def _configs(argv: list[str]) -> list[str]:
    return [argv[i + 1] for i, arg in enumerate(argv) if arg == "--config"]


def test_every_claims_base_and_runs_name_configuration_files_that_exist():
    for claim in all_claims():
        assert _configs(claim.base), f"{claim.key}: its base names no configuration"
        for label, argv in {"base": claim.base, **claim.runs}.items():
            assert all(isinstance(a, str) for a in argv), f"{claim.key}.{label}"
            for path in _configs(argv):
                assert (ROOT / path).is_file(), f"{claim.key}.{label}: {path}"


def test_the_lr_grids_are_the_ones_docs_paper_vs_code_states():
    lines = (ROOT / "docs" / "paper_vs_code.md").read_text().splitlines()
    rows = {line.split("|")[1].strip(): line for line in lines if line.startswith("| ")}  # the paper's and pfl's
    row_of = {"fedora_rotated": "FedORA Tables 1 and 3", "fedora_rotated_big": "FedORA Tables 1 and 3",
              "fedpg_table1": "FedPG Table 1", "plgu_tails": "PLGU Tables 1–2", "pgfed_table": "PGFed Table 1",
              "page_table1_synthetic": "PAGE Table 1"}  # fmt: skip
    own_lr = {"page_table1_synthetic": {"page", "dapfl", "page_fixed", "page_random"}}  # the agents choose it
    for claim in all_claims():
        if claim.key not in row_of:
            assert claim.lr_grid is None, claim.key
            continue
        grid, row = claim.lr_grid, rows[row_of[claim.key]]
        assert "{" + ", ".join(f"{v:g}" for v in grid.values) + "}" in row and f"after {grid.rounds} of" in row
        assert {label for label in claim.runs if not grid.applies(label)} == own_lr.get(claim.key, set()), claim.key


def test_the_run_lengths_are_the_documented_ones():
    from pfl.runner.claims import page, pgfed

    docs = " ".join((ROOT / "docs" / "reproduce.md").read_text().split())

    def rounds(base: list[str]) -> str:
        return base[base.index("--trainer.rounds") + 1]

    assert f"for **{rounds(page.PAGE_BASE)} rounds**" in docs and int(rounds(page.PAGE_BASE)) == page.ROUNDS
    assert f"**{rounds(pgfed.PGFED_BASE)} of the configuration's" in docs


def test_page_diagnose_ranks_page_and_sets_its_agents_against_both_controls():
    from pfl.runner.claims import page

    rows = {"page": (0.8, 0.9), "page_fixed": (0.7, 0.7), "page_random": (0.6, 0.5), "fedavg": (0.75, 0.75)}
    s = {seed: {k: {"metrics": {"pm.l_acc.mean": v[seed], "pm.l_acc": v[seed], "gm.acc": 0.5}} for k, v in rows.items()}
         for seed in (0, 1)}  # fmt: skip
    del s[1]["page_random"]  # finished on seed 0 only: its mean is over that seed
    lines = page.page_diagnose(s)
    assert lines[0].startswith("pm.l_acc.mean (mean over seeds): page 0.8500 ranks 1 of 4")
    assert lines[-1] == (
        "pm.l_acc of the agents' actions against the controls: page 0.8500, frozen at the baselines' values 0.7000, "
        "random 0.6000 (means over seeds)."
    )
    del s[0]["page_random"]  # no control run at all: no comparison line
    assert len(page.page_diagnose(s)) == 2


# -- a run's table of clients ---------------------------------------------------------------------------
def _run(tmp_path: Path, name: str, text: str | bytes | None) -> dict:
    folder = tmp_path / name
    folder.mkdir()
    if text is not None:
        (folder / "clients.csv").write_bytes(text if isinstance(text, bytes) else text.encode())
    return {"run_dir": str(folder), "metrics": {}}


def test_a_runs_client_scores_are_read_by_client_id_in_the_files_order(tmp_path):
    run = _run(tmp_path, "a", "client,n_train,pm.l_acc,pm.val_acc\n0,5,0.5,\n2,5,nan,0.25\n1,5,1.0,0.75\n")
    scores = client_scores(run, "pm.l_acc")
    assert list(scores) == [0, 2, 1] and scores[0] == 0.5 and scores[1] == 1.0 and math.isnan(scores[2])
    assert client_scores(_run(tmp_path, "none", "client,pm.l_acc\n"), "pm.l_acc") == {}  # no client: no score


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (None, "missing: every run writes its table of clients"),
        (b"client,pm.l_acc\n0,\xff\n", r"not a run's table of clients \('utf-8'"),
        ("client,pm.l_acc\n0," + "1" * 200_000 + "\n", r"not a run's table of clients \(field larger"),
        ("", r"not a run's table of clients \(a client column of client ids\)"),
        ("pm.l_acc\n0.5\n", r"not a run's table of clients \(a client column of client ids\)"),
        ("client,pm.l_acc\nx,0.5\n", r"not a run's table of clients \(a client column"),
        ("pm.l_acc,client\n0.5\n", r"not a run's table of clients \(a client column"),  # a row without its id
        ("client,other\n0,0.5\n", "has no number in its 'pm.l_acc' column for every client"),
        ("client,pm.l_acc\n0,0.5\n1,\n", "has no number in its 'pm.l_acc' column for every client"),
        ("client,pm.l_acc\n0,0.5\n1\n", "has no number in its 'pm.l_acc' column for every client"),
        ("client,pm.l_acc\n0,high\n", "has no number in its 'pm.l_acc' column for every client"),
    ],
)
def test_a_table_of_clients_that_a_run_did_not_write_is_refused_in_one_line_naming_it(tmp_path, text, problem):
    run = _run(tmp_path, "a", text)
    path = tmp_path / "a" / "clients.csv"
    with pytest.raises(ConfigError, match=f"^{re.escape(str(path))}: {problem}.*remove the run's folder") as err:
        client_scores(run, "pm.l_acc")
    assert "\n" not in str(err.value)
    assert text is None or path.read_bytes() == (text if isinstance(text, bytes) else text.encode())


def test_two_runs_clients_pair_up_by_id_in_the_references_order(tmp_path):
    local = _run(tmp_path, "local", "client,pm.l_acc\n0,0.5\n1,0.25\n2,1.0\n")
    mine = _run(tmp_path, "mine", "client,pm.l_acc\n2,0.75\n0,0.5\n1,0.5\n")
    assert client_pairs(mine, local, "pm.l_acc") == [(0.5, 0.5), (0.5, 0.25), (0.75, 1.0)]
    for name, text in {"fewer": "client,pm.l_acc\n0,0.5\n1,0.5\n", "other": "client,pm.l_acc\n0,1\n1,1\n3,1\n"}.items():
        run = _run(tmp_path, name, text)
        where = re.escape(str(tmp_path / name / "clients.csv"))
        problem = f"its clients are not those of {re.escape(str(tmp_path / 'local' / 'clients.csv'))}"
        with pytest.raises(ConfigError, match=f"^{where}: {problem} \\(remove the run's folder"):
            client_pairs(run, local, "pm.l_acc")


def test_each_claim_cites_the_table_its_recorded_section_names():
    """The recorded results' section of every claim is headed by the claim's paper and table (the report's form)."""
    lines = (ROOT / "docs" / "reproduce_results.md").read_text().splitlines()
    headings = {line for line in lines if line.startswith("### ")}
    for claim in all_claims():
        assert f"### {claim.paper}: {claim.key}" in headings, claim.key


def test_seed_mean_reads_a_metric_or_its_mean_over_the_seeds_that_report_it():
    s = {
        0: {"a": {"metrics": {"acc": 0.5}}, "b": {"metrics": {"loss": 1.0}}},
        1: {"a": {"metrics": {"acc.mean": 0.7}}},
        2: {"b": {"metrics": {"acc": 0.9}}},
    }
    assert seed_mean(s, "a", "acc") == pytest.approx(0.6)  # seed 0's value, seed 1's mean; seed 2 has no run a
    assert seed_mean(s, "b", "acc") == pytest.approx(0.9)  # seed 0's run b does not report acc
    assert seed_mean(s, "a", "loss") is None and seed_mean(s, "c", "acc") is None
