"""Chart data from a matplotlib figure, in the shape of the SDKs' `chart` object.

Runs inside the Python kernel (registered as the `e2b/chart` formatter by kernel_setup.py).
A figure with one chart gives that chart; several axes give a `superchart` whose elements are
the charts. Each axes is classified by what it holds:
  boxes (ax.boxplot)         -> box_and_whisker {label, min, quartiles, median, max, outliers}
  wedges (ax.pie)            -> pie        {label, angle, radius}
  bar containers (ax.bar)    -> bar        {label, value, group}
  lines (ax.plot)            -> line       {label, points: [[x, y], ...]}
  point collections (scatter)-> scatter    {label, points}
  anything else              -> unknown    (elements empty; the PNG still shows it)
Values on date axes become ISO-8601 strings and on category axes the category names, so a
client can redraw the chart without knowing matplotlib's internal numbers. A unit at the end of
an axis label ("Time (s)") is reported as that axis' unit.
"""

import math
import re


def chart_from_figure(figure):
    charts = []
    for ax in figure.get_axes():
        if not ax.get_visible() or getattr(ax, "_colorbar", None) is not None:
            continue
        charts.append(chart_from_axes(ax))
    if not charts:
        return None
    if len(charts) == 1:
        return charts[0]
    title = figure._suptitle.get_text() if getattr(figure, "_suptitle", None) else None
    return {"type": "superchart", "title": title, "elements": charts}


def chart_from_axes(ax):
    from matplotlib.collections import PathCollection
    from matplotlib.container import BarContainer
    from matplotlib.patches import Wedge

    wedges = [p for p in ax.patches if isinstance(p, Wedge)]
    bars = [c for c in ax.containers if isinstance(c, BarContainer)]
    lines = [ln for ln in ax.get_lines() if ln.get_visible()]
    points = [c for c in ax.collections if isinstance(c, PathCollection)]
    title = ax.get_title() or None
    boxes = _boxes(ax, lines)
    if boxes:
        return dict(_axes_2d(ax), type="box_and_whisker", title=title, elements=boxes)
    if wedges:
        return {"type": "pie", "title": title, "elements": [_wedge(w) for w in wedges]}
    if bars:
        return dict(_axes_2d(ax), type="bar", title=title, elements=_bars(ax, bars))
    if lines and not points:
        elements = [_series(ax, ln.get_label(), ln.get_xydata()) for ln in lines]
        return dict(_axes_2d(ax), **_scales_and_ticks(ax), type="line", title=title,
                    elements=elements)
    if points and not lines:
        elements = [_series(ax, c.get_label(), c.get_offsets()) for c in points]
        return dict(_axes_2d(ax), **_scales_and_ticks(ax), type="scatter", title=title,
                    elements=elements)
    return {"type": "unknown", "title": title, "elements": []}


# A unit written at the end of an axis label: "Time (s)", "Price [EUR]".
_UNIT = re.compile(r"[(\[]([^()\[\]]+)[)\]]\s*$")


def _axes_2d(ax):
    out = {}
    for name, label in (("x", ax.get_xlabel()), ("y", ax.get_ylabel())):
        unit = _UNIT.search(label or "")
        out[f"{name}_label"] = label or None
        out[f"{name}_unit"] = unit.group(1).strip() if unit else None
    return out


def _axis_kind(axis):
    """'datetime', 'categorical' or None (numbers) for a matplotlib Axis."""
    import matplotlib.category as mcategory
    import matplotlib.dates as mdates

    converter = getattr(axis, "converter", None)
    if converter is None and hasattr(axis, "get_converter"):
        converter = axis.get_converter()
    date_types = tuple(
        t for t in (getattr(mdates, n, None) for n in
                    ("DateConverter", "ConciseDateConverter", "_SwitchableDateConverter"))
        if isinstance(t, type)
    )
    if date_types and isinstance(converter, date_types):
        return "datetime"
    if isinstance(converter, mcategory.StrCategoryConverter):
        return "categorical"
    return None


def _categories(axis):
    units = getattr(axis, "units", None)
    mapping = getattr(units, "_mapping", None) or {}
    return {float(v): str(k) for k, v in mapping.items()}


def _value(axis, kind, number):
    """One coordinate in the client's terms."""
    number = float(number)
    if kind == "datetime":
        import matplotlib.dates as mdates

        return mdates.num2date(number).isoformat()
    if kind == "categorical":
        return _categories(axis).get(number, _number(number))
    return _number(number)


def _number(x):
    x = float(x)
    if math.isnan(x) or math.isinf(x):
        return None  # JSON has no NaN/Infinity
    return x


def _series(ax, label, xy):
    x_kind, y_kind = _axis_kind(ax.xaxis), _axis_kind(ax.yaxis)
    pts = [[_value(ax.xaxis, x_kind, x), _value(ax.yaxis, y_kind, y)] for x, y in xy]
    return {"label": _label(label), "points": pts}


def _label(label):
    # matplotlib names unlabelled artists "_child0", "_line1"...: not a user label.
    return "" if not label or str(label).startswith("_") else str(label)


def _scales_and_ticks(ax):
    out = {}
    for name, axis, scale in (("x", ax.xaxis, ax.get_xscale()), ("y", ax.yaxis, ax.get_yscale())):
        kind = _axis_kind(axis)
        ticks = list(axis.get_majorticklocs())
        try:
            labels = list(axis.get_major_formatter().format_ticks(ticks))
        except Exception:
            labels = [str(t) for t in ticks]
        out[f"{name}_scale"] = kind or scale
        out[f"{name}_ticks"] = [_value(axis, kind, t) for t in ticks]
        out[f"{name}_tick_labels"] = [str(label) for label in labels]
    return out


def _bars(ax, containers):
    elements = []
    for container in containers:
        horizontal = getattr(container, "orientation", "vertical") == "horizontal"
        axis = ax.yaxis if horizontal else ax.xaxis
        kind = _axis_kind(axis)
        group = _label(container.get_label())
        for rect in container.patches:
            if horizontal:
                centre, value = rect.get_y() + rect.get_height() / 2, rect.get_width()
            else:
                centre, value = rect.get_x() + rect.get_width() / 2, rect.get_height()
            label = _value(axis, kind, round(centre, 9))
            elements.append({"label": str(label), "value": _number(value), "group": group})
    return elements


def _wedge(w):
    # matplotlib keeps wedge angles in float32 (324 degrees comes back as 323.99999141...):
    # four decimals is all the precision they carry.
    angle = round(abs(w.theta2 - w.theta1), 4)
    return {"label": _label(w.get_label()), "angle": angle, "radius": w.r}


def _boxes(ax, lines):
    """Box-and-whisker elements if this axes holds an ax.boxplot (vertical), else []."""
    from matplotlib.patches import PathPatch

    rects = []  # (x0, x1, q1, q3)
    for patch in ax.patches:  # boxplot(patch_artist=True): the boxes are PathPatches
        if isinstance(patch, PathPatch):
            xy = patch.get_path().vertices
            rects.append((xy[:, 0].min(), xy[:, 0].max(), xy[:, 1].min(), xy[:, 1].max()))
    for line in lines:  # the default: each box is a closed 5-point line
        xy = line.get_xydata()
        if len(xy) == 5 and tuple(xy[0]) == tuple(xy[-1]) and \
                len(set(xy[:, 0])) == 2 and len(set(xy[:, 1])) == 2:
            rects.append((xy[:, 0].min(), xy[:, 0].max(), xy[:, 1].min(), xy[:, 1].max()))
    if not rects:
        return []
    x_kind = _axis_kind(ax.xaxis)
    ticks = list(ax.xaxis.get_majorticklocs())
    try:
        tick_labels = list(ax.xaxis.get_major_formatter().format_ticks(ticks))
    except Exception:
        tick_labels = [str(t) for t in ticks]
    elements = []
    for x0, x1, q1, q3 in sorted(rects):
        centre = (x0 + x1) / 2
        median, low, high, outliers = None, q1, q3, []
        for line in lines:
            xy = line.get_xydata()
            xs, ys = xy[:, 0], xy[:, 1]
            if len(xy) == 0:
                continue
            if line.get_linestyle() in ("None", "", " ") and all(abs(x - centre) < 1e-9 for x in xs):
                outliers.extend(float(y) for y in ys)  # fliers: markers only
            elif len(xy) == 2 and ys[0] == ys[1] and x0 - 1e-9 <= min(xs) and max(xs) <= x1 + 1e-9 \
                    and q1 <= ys[0] <= q3 and min(xs) <= centre <= max(xs) and xs[0] != xs[1]:
                median = float(ys[0])
            elif len(xy) == 2 and xs[0] == xs[1] and abs(xs[0] - centre) < 1e-9:
                low, high = min(low, float(ys.min())), max(high, float(ys.max()))  # whiskers
        label = next((str(lbl) for t, lbl in zip(ticks, tick_labels) if abs(t - centre) < 1e-9),
                     str(_value(ax.xaxis, x_kind, centre)))
        elements.append({
            "label": label, "min": _number(low), "first_quartile": _number(q1),
            "median": _number(median) if median is not None else None,
            "third_quartile": _number(q3), "max": _number(high), "outliers": sorted(outliers),
        })
    return elements
