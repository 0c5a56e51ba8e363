"""`benches/run.py --compare`: each metric beside its baseline from the same run and beside the
previous results file, so a regression shows at a glance.

Absolute times move with the host's load; a metric's ratio to a baseline measured in the same
run moves much less. So the verdict compares ratios: a metric is flagged when its ratio to its
baseline got worse than the previous run's by more than the threshold (10% by default), and,
for metrics without a baseline, when its median did. "Worse" is higher for times and sizes,
lower for rates (units ending in "/s").
"""

from __future__ import annotations

import glob
import json
import math
import os
from typing import Dict, List, Optional, Tuple

Key = Tuple[str, str]


def load(path: str) -> Dict:
    with open(path) as f:
        return json.load(f)


def previous_results(results_dir: str, exclude: Optional[str] = None) -> Optional[str]:
    """The newest results.json under `results_dir` (one directory per run, named by its start
    time), other than the one in `exclude`."""
    found = sorted(glob.glob(os.path.join(results_dir, "*", "results.json")))
    if exclude:
        found = [p for p in found if os.path.dirname(os.path.abspath(p)) != os.path.abspath(exclude)]
    return found[-1] if found else None


def _medians(data: Dict) -> Dict[Key, Dict]:
    out = {}
    for m in data.get("metrics", []):
        if m.get("n"):
            out[(m["scenario"], m["metric"])] = m
    return out


def _ratio(medians: Dict[Key, Dict], key: Key) -> Optional[float]:
    m = medians.get(key)
    if not m or not m.get("baseline"):
        return None
    b = medians.get((key[0], m["baseline"]))
    if not b or not b.get("median"):
        return None
    return m["median"] / b["median"]


def higher_is_better(unit: str) -> bool:
    return unit.endswith("/s")


def _fmt(v: Optional[float], suffix: str = "") -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "—"
    if abs(v) >= 100:
        return f"{v:.0f}{suffix}"
    if abs(v) >= 10:
        return f"{v:.1f}{suffix}"
    return f"{v:.2f}{suffix}"


def compare(current: Dict, previous: Optional[Dict], threshold: float = 0.10) -> Tuple[str, List[str]]:
    """A Markdown table of every metric of `current` against `previous`, and the list of
    metrics that regressed beyond `threshold`."""
    now = _medians(current)
    before = _medians(previous) if previous else {}
    rows = [
        "| scenario | metric | unit | median | ratio to baseline | previous median | previous ratio | change | verdict |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    regressions = []
    # Baselines measure the host, not Warren: shown, never a verdict.
    baselines = {(k[0], m["baseline"]) for k, m in now.items() if m.get("baseline")}
    for key, m in now.items():
        ratio, old = _ratio(now, key), before.get(key)
        old_ratio = _ratio(before, key) if old else None
        # Compared by ratio where both runs have one, else by median.
        if ratio is not None and old_ratio:
            change = ratio / old_ratio
        elif old and old.get("median"):
            change = m["median"] / old["median"]
        else:
            change = None
        verdict = "new" if old is None else "—"
        if key in baselines:
            verdict = "baseline"
        elif change is not None:
            worse = change < 1 - threshold if higher_is_better(m["unit"]) else change > 1 + threshold
            better = change > 1 + threshold if higher_is_better(m["unit"]) else change < 1 - threshold
            verdict = "WORSE" if worse else "better" if better else "same"
            if worse:
                regressions.append(f"{key[0]}: {key[1]} ({_fmt(change, 'x')})")
        rows.append(
            f"| {key[0]} | {key[1]} | {m['unit']} | {_fmt(m['median'])} | {_fmt(ratio, 'x')} | "
            f"{_fmt(old['median']) if old else '—'} | {_fmt(old_ratio, 'x')} | {_fmt(change, 'x')} | {verdict} |"
        )
    return "\n".join(rows), regressions
