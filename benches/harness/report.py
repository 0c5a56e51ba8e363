"""results.json, results.md (a Markdown table) and latency.png (matplotlib, Agg)."""

from __future__ import annotations

import json
import math
import os
from typing import Dict, List

from .common import Metric, Results


def _fmt(v: float) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "—"
    if abs(v) >= 100:
        return f"{v:.0f}"
    if abs(v) >= 10:
        return f"{v:.1f}"
    return f"{v:.2f}"


def table(results: Results) -> str:
    rows = ["| scenario | metric | unit | n | median | p90 | p99 | max | baseline median | ratio to baseline |",
            "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for m in results.metrics:
        if not m.samples:
            continue
        s = m.summary()
        b = results.find(m.scenario, m.baseline) if m.baseline else None
        bmed = b.summary()["median"] if b and b.samples else None
        ratio = f"{s['median'] / bmed:.2f}x" if bmed else "—"
        name = m.name + (f" ({m.note})" if m.note else "")
        rows.append(f"| {m.scenario} | {name} | {m.unit} | {s['n']} | {_fmt(s['median'])} | {_fmt(s['p90'])} | "
                    f"{_fmt(s['p99'])} | {_fmt(s['max'])} | {_fmt(bmed) if bmed else '—'} | {ratio} |")
    return "\n".join(rows)


def write_all(results: Results, out: str, meta: Dict) -> None:
    os.makedirs(out, exist_ok=True)
    data = {
        "meta": meta,
        "notes": results.notes,
        "metrics": [
            {"scenario": m.scenario, "metric": m.name, "unit": m.unit, "baseline": m.baseline,
             "note": m.note, **m.summary(), "samples": m.samples}
            for m in results.metrics
        ],
    }
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(data, f, indent=2)
    md = [f"# Warren benchmark results ({meta.get('started')})", "",
          f"Command: `{meta.get('command')}`", "",
          f"Machine: {meta.get('machine')}", "", table(results), ""]
    for sc, notes in results.notes.items():
        for n in notes:
            md.append(f"- {sc}: {n}")
    with open(os.path.join(out, "results.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    plot(results, os.path.join(out, "latency.png"))


def plot(results: Results, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups: Dict[str, List[Metric]] = {}
    for m in results.metrics:
        if m.plot and m.samples:
            groups.setdefault(m.scenario, []).append(m)
    if not groups:
        return
    heights = [max(1.6, 0.45 * len(ms) + 0.9) for ms in groups.values()]
    fig, axes = plt.subplots(len(groups), 1, figsize=(11, sum(heights)),
                             gridspec_kw={"height_ratios": heights}, squeeze=False)
    for ax, (sc, ms) in zip(axes[:, 0], groups.items()):
        data = [m.samples for m in ms]
        labels = [m.name for m in ms]
        bp = ax.boxplot(data, vert=False, whis=(0, 99), showfliers=True, patch_artist=True,
                        medianprops={"color": "black"})
        for patch, m in zip(bp["boxes"], ms):
            patch.set_facecolor("#bbbbbb" if m.name.startswith("baseline") else "#6fa8dc")
        ax.set_yticks(range(1, len(ms) + 1), labels, fontsize=8)
        units = sorted({m.unit for m in ms})
        lo = min(min(d) for d in data)
        if lo > 0 and max(max(d) for d in data) / lo > 20:
            ax.set_xscale("log")
        ax.set_xlabel(" / ".join(units))
        ax.set_title(f"{sc} (grey: baselines; whiskers: min to p99)", fontsize=10)
        ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
