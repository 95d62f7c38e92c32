"""bench.same_numbers: a written file is checked against the same code with 0 differences, and a check on
another platform says so before comparing."""

from __future__ import annotations

import json

from bench import same_numbers

AMD = {"torch": "2.14.1", "cpu": "AMD EPYC", "cpu_kernels": "AVX2", "threads": 1}


def test_a_file_written_by_this_code_checks_with_no_difference_and_records_its_platform(tmp_path, capsys):
    path = tmp_path / "before.json"
    assert same_numbers.main(["--write", str(path), "--only", "fedavg"]) == 0
    written = json.loads(path.read_text())
    assert set(written) == {"platform", "runs"} and list(written["runs"]) == ["fedavg"]
    assert written["platform"]["cpu_kernels"] and written["platform"]["torch"]
    capsys.readouterr()
    assert same_numbers.main(["--check", str(path), "--only", "fedavg"]) == 0
    out = capsys.readouterr().out
    assert "1 runs, " in out and "compared: 0 differ" in out and "platforms differ" not in out
    key = next(iter(written["runs"]["fedavg"]))
    written["runs"]["fedavg"][key] = "0.5"  # one number changed: found
    written["platform"] = {**AMD, "cpu": "Intel Xeon", "cpu_kernels": "AVX512"}
    path.write_text(json.dumps(written))
    assert same_numbers.main(["--check", str(path), "--only", "fedavg"]) == 1
    first, second = capsys.readouterr().out.splitlines()[1:3]  # after the run's own line
    assert first.startswith("platforms differ: the file's runs on torch 2.14.1, Intel Xeon (AVX512 kernels")
    assert second == "1 runs, " + second.split(", ", 1)[1] and second.endswith("compared: 1 differ")


def test_a_file_written_before_platforms_were_recorded_is_all_runs_and_no_platform(tmp_path):
    old = {"fedavg": {"gm.acc": "0.5"}, "platform_run": {"m": "1"}}  # a label may be any name
    path = tmp_path / "old.json"
    path.write_text(json.dumps(old))
    assert same_numbers.read_numbers(path) == (old, None)
    path.write_text(json.dumps({"platform": AMD, "runs": old}))
    assert same_numbers.read_numbers(path) == (old, AMD)
    named_runs = {"runs": {"gm.acc": "0.5"}}  # an old file whose one label happens to be "runs"
    path.write_text(json.dumps(named_runs))
    assert same_numbers.read_numbers(path) == (named_runs, None)


def test_a_platform_note_only_where_both_platforms_are_known_and_differ():
    intel = {**AMD, "cpu": "Intel Xeon"}
    assert same_numbers.platform_note(AMD, dict(AMD)) is None
    assert same_numbers.platform_note(None, AMD) is None and same_numbers.platform_note(AMD, None) is None
    assert same_numbers.platform_note(AMD, intel) == (
        "platforms differ: the file's runs on torch 2.14.1, AMD EPYC (AVX2 kernels, 1 thread), these on "
        "torch 2.14.1, Intel Xeon (AVX2 kernels, 1 thread); numbers can differ by platform alone"
    )
