"""benches/run.py --compare: the verdicts compare ratios to same-run baselines, baselines are
never a verdict, rates are better when higher, and the previous results file is found."""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benches"))

from harness import compare  # noqa: E402


def metric(scenario, name, unit, median, baseline=None):
    return {"scenario": scenario, "metric": name, "unit": unit, "baseline": baseline, "n": 5, "median": median}


BASE = "baseline bash -c true"
CMD = "SDK commands.run('true')"


def run(*metrics):
    return {"meta": {}, "metrics": list(metrics)}


def test_a_slower_host_is_not_a_regression_but_a_worse_ratio_is():
    before = run(metric("command", BASE, "ms", 1.0), metric("command", CMD, "ms", 5.0, BASE))
    # Everything twice as slow: the ratio is the same.
    slow_host = run(metric("command", BASE, "ms", 2.0), metric("command", CMD, "ms", 10.0, BASE))
    table, regressions = compare.compare(slow_host, before)
    assert regressions == []
    assert "| command | baseline bash -c true | ms | 2.00 | — | 1.00 | — | 2.00x | baseline |" in table
    assert "| 5.00x | 5.00 | 5.00x | 1.00x | same |" in table
    # Same host, Warren slower: flagged.
    worse = run(metric("command", BASE, "ms", 1.0), metric("command", CMD, "ms", 6.0, BASE))
    _, regressions = compare.compare(worse, before)
    assert regressions == ["command: SDK commands.run('true') (1.20x)"]


def test_rates_are_better_when_higher_and_new_metrics_are_marked():
    before = run(metric("files", "download", "MiB/s", 100.0))
    after = run(metric("files", "download", "MiB/s", 80.0), metric("pty", "open", "ms", 3.0))
    table, regressions = compare.compare(after, before)
    assert regressions == ["files: download (0.80x)"]
    assert "| pty | open | ms | 3.00 | — | — | — | — | new |" in table
    _, none = compare.compare(run(metric("files", "download", "MiB/s", 130.0)), before)
    assert none == []


def test_without_a_previous_run_every_metric_is_new(tmp_path):
    table, regressions = compare.compare(run(metric("create", "x", "ms", 1.0)), None)
    assert regressions == [] and "| new |" in table
    assert compare.previous_results(str(tmp_path)) is None
    for stamp in ("2026-12-01T10-00-00", "2026-12-02T10-00-00", "2026-12-03T10-00-00"):
        (tmp_path / stamp).mkdir()
        (tmp_path / stamp / "results.json").write_text(json.dumps(run()))
    newest = str(tmp_path / "2026-12-03T10-00-00")
    assert compare.previous_results(str(tmp_path)) == os.path.join(newest, "results.json")
    # The run being compared is never its own previous.
    assert compare.previous_results(str(tmp_path), exclude=newest).endswith("2026-12-02T10-00-00/results.json")
