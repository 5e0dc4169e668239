"""Paper-style tables of a study's selected runs (Cole et al. Table 1, Zhou et al. Table 1, ...).

Methods are rows, grouped by label regime in the papers' order: ``full`` (All P. & All N.),
``1p_alln`` (1 P. & All N.), ``1p_1n`` (1 P. & 1 N.), ``1p`` (1 P. & 0 N.), other regimes after.
Datasets (or a vary axis) are columns; a cell is the mean ± sample standard deviation over seeds
of the selected runs (the mean alone for one seed). Per column the best and second best value are
marked, like the papers, among the single-positive rows (``rank_group="1p"``; among all rows when
the table has no such row): bold / underline in Markdown (``**x**`` / ``<u>x</u>``) and LaTeX
(``\\textbf`` / ``\\underline``), ``<strong>`` / ``<u>`` in HTML, a ``rank`` column in CSV. Values
are compared as shown (rounded), so a tie marks both.

>>> rows = [{"method": m, "dataset": "voc", "regime": r, "seed": s, "variant": "{}",
...          "test_map": v + s} for m, r, v in [("bce", "full", 89), ("an", "1p", 85),
...                                               ("role", "1p", 87)] for s in (0, 2)]
>>> print(study_table(rows), end="")
| Method | voc |
|---|---|
| *All P. & All N.* | |
| bce | 90.00 ± 1.41 |
| *1 P. & 0 N.* | |
| an | <u>86.00 ± 1.41</u> |
| role | **88.00 ± 1.41** |
"""
from __future__ import annotations

import csv
import html
import io
import json
import math
import re
from dataclasses import dataclass

from .store import latex_escape

FORMATS = ("markdown", "latex", "csv", "html")
#: the papers' regime order and names (Cole et al. Table 1)
REGIME_ORDER = ("full", "1p_alln", "1p_1n", "1p")
REGIME_TITLES = {"full": "All P. & All N.", "1p_alln": "1 P. & All N.", "1p_1n": "1 P. & 1 N.",
                 "1p": "1 P. & 0 N."}
#: row columns (everything else is looked up in ``variant``, then in ``metrics``)
_PLAIN = ("method", "loss", "dataset", "regime", "seed", "mode", "batch_size", "lr", "status")


def _json(text) -> dict:
    if isinstance(text, dict):
        return text
    try:
        value = json.loads(text or "{}")
    except (TypeError, json.JSONDecodeError):
        return {}
    return value if isinstance(value, dict) else {}


def row_variant(row: dict) -> dict:
    """The vary assignment of a store row (its ``variant``, JSON text or a dict)."""
    v = row.get("variant") or "{}"
    if isinstance(v, dict):
        return v
    try:
        out = json.loads(v)
    except (TypeError, json.JSONDecodeError):
        raise ValueError(f"run {row.get('run_id')}: variant {v!r} is not JSON") from None
    if not isinstance(out, dict):
        raise ValueError(f"run {row.get('run_id')}: variant {v!r} is not a mapping")
    return out


def axis_value(row: dict, key: str):
    """``row[key]`` for a plain column, else the vary assignment's value (``hparams.alpha``,
    ``data.subsample``, ``k``); ``KeyError`` when neither has it."""
    if key in _PLAIN and key in row:
        return row[key]
    variant = row_variant(row)
    if key in variant:
        return variant[key]
    if key in row:
        return row[key]
    raise KeyError(key)


def metric_value(row: dict, metric: str):
    """A row's metric: its column, else a key of its ``metrics`` JSON (``test.precision@k`` walks
    into nested dicts); ``None`` when missing or not a finite number."""
    value = row.get(metric)
    if value is None:
        value = _json(row.get("metrics"))
        for part in metric.split("."):
            value = value.get(part) if isinstance(value, dict) else None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _short(key: str) -> str:
    return key.split(".", 1)[1] if key.startswith(("hparams.", "data.")) else key


def _label(row: dict, rows: str, skip: set, shown: dict | None = None) -> str:
    label = str(axis_value(row, rows))
    label = str((shown or {}).get(label, label))
    extra = {k: v for k, v in row_variant(row).items() if k not in skip}
    if extra:
        label += " (" + ", ".join(f"{_short(k)}={v}" for k, v in sorted(extra.items())) + ")"
    return label


def _natural(value) -> list:
    """Sort key: numbers inside text compare as numbers (``estimate:5`` before ``estimate:10``)."""
    parts = re.split(r"(\d+(?:\.\d+)?)", str(value))
    return [(0, float(p), "") if i % 2 else (1, 0.0, p) for i, p in enumerate(parts)]


def _ordered(values) -> list:
    values = list(dict.fromkeys(values))
    if values and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        return sorted(values)
    if values and all(isinstance(v, str) for v in values) and _holds_numbers(values):
        return sorted(values, key=_natural)
    return values


def _holds_numbers(values) -> bool:
    """Every value holds a number (``k=estimate:5:lower``, ``mlml:0.3``): sort them naturally;
    names (datasets) keep the order they came in."""
    return all(re.search(r"\d", v) for v in values)


def _group_order(groups) -> list:
    groups = list(dict.fromkeys(groups))
    return [g for g in REGIME_ORDER if g in groups] + [g for g in groups if g not in REGIME_ORDER]


def metric_column(name: str, split: str = "test") -> str:
    """Where a run row keeps metric ``name`` of `spmlkit.metrics.METRICS` on ``split``
    (``"test"`` or ``"val"``): ``test_map`` / ``val_map`` for mAP (the store's columns), else
    ``test_metrics.<name>`` / ``val_metrics.<name>`` of the row's ``metrics`` JSON.

    >>> metric_column("map"), metric_column("ranking_loss", "val")
    ('test_map', 'val_metrics.ranking_loss')
    """
    from ..metrics import check_metric

    check_metric(name)
    if split not in ("test", "val"):
        raise ValueError(f"split must be 'test' or 'val', got {split!r}")
    return f"{split}_map" if name == "map" else f"{split}_metrics.{name}"


def metrics_table(selected_rows, metrics, fmt: str = "markdown", split: str = "test", *,
                  title: str | None = None, order=None, group: str | None = "regime",
                  labels: dict | None = None) -> str:
    """Methods as rows, metrics of `spmlkit.metrics.METRICS` as columns (one column per
    dataset x metric when the rows span several datasets): mean ± std over seeds of the
    selected runs' ``split`` values, each column with its own decimals and direction (the
    best of a lower-is-better metric is its smallest value). ``order``, ``group`` and
    ``labels`` as in `study_table`.

    Raises:
        ValueError: an unknown metric, or no row has any of them.
    """
    from ..metrics import METRICS, check_metric

    metrics = [check_metric(m) for m in metrics]
    datasets = list(dict.fromkeys(r.get("dataset") for r in selected_rows))
    flat, decimals, higher = [], {}, {}
    for r in selected_rows:
        for m in metrics:
            col = m if len(datasets) < 2 else f"{r.get('dataset')}: {m}"
            value = metric_value(r, metric_column(m, split))
            if value is None:
                continue
            flat.append({**r, "metric": col, "value": value, "metrics": "{}"})
            decimals[col], higher[col] = METRICS[m].decimals, METRICS[m].higher_is_better
    if not flat:
        raise ValueError(f"no selected run has {split} values of {', '.join(metrics)} (runs "
                         f"from before these metrics were recorded: train them again)")
    shown = {f["metric"].rsplit(": ", 1)[-1] for f in flat}
    missing = [m for m in metrics if m not in shown]
    if missing:  # a column left out without a word looked like a table of the others only
        raise ValueError(f"no selected run has {split} values of {', '.join(missing)} (runs "
                         f"from before these metrics were recorded: train them again, or leave "
                         f"{'it' if len(missing) == 1 else 'them'} out of --metric)")
    return study_table(flat, fmt, "value", columns="metric", group=group, title=title,
                       order=order, decimals=decimals, higher_is_better=higher, labels=labels)


def study_table(selected_rows, fmt: str = "markdown", metric: str = "test_map",
                rows: str = "method", columns: str = "dataset", group: str | None = "regime", *,
                title: str | None = None, order=None, decimals: int | dict = 2,
                rank_group: str | None = "1p", higher_is_better: bool | dict = True,
                labels: dict | None = None) -> str:
    """Render selected study rows as the papers' table.

    Args:
        selected_rows: dicts with at least ``rows``, ``columns``, ``group`` (row columns or vary
            keys of ``variant``), ``seed`` and ``metric``: what ``StudyStore.selected()``
            returns. Rows whose metric is missing or NaN are left out; a row whose ``status``
            is not ``done`` too.
        fmt: ``markdown`` (``md``), ``latex``, ``csv`` or ``html``.
        metric: the value shown (a column such as ``test_map``, or a key of the ``metrics``
            JSON, e.g. ``test.f1``).
        rows, columns, group: what makes a table row, a column and a row group. A vary key that
            is none of them is appended to the row label (``em (alpha=0.1)``).
        title: a caption (Markdown: a first line; LaTeX: a comment; HTML: ``<caption>``).
        order: row labels in the wanted order (the rest follow in order of appearance).
        labels: ``{row value: text shown}`` for rows shown under another name (a study's
            methods trained in another mode: `spmlkit.experiments.study.StudySpec.
            row_labels`); ``order`` names the row values, not the texts.
        decimals: digits after the point; a dict gives them per column value (others: 2).
        rank_group: the group within which best / second best are marked (``None``: all rows;
            all rows too when no row is in that group).
        higher_is_better: the direction of "best"; a dict gives it per column value (others:
            higher).

    Returns:
        the table as text (ends with a newline).

    Raises:
        ValueError: unknown ``fmt``, or no row has a usable ``metric``.
    """
    fmt = {"md": "markdown", "tex": "latex"}.get(fmt, fmt)
    if fmt not in FORMATS:
        raise ValueError(f"unknown table format {fmt!r}; choose one of {', '.join(FORMATS)}")
    if group == columns:  # e.g. --columns regime: the regimes are the columns, no row groups
        group = None
    cells, row_groups, cols, group_values = _cells(selected_rows, metric, rows, columns, group,
                                                   labels)
    places = {c: (decimals.get(c, 2) if isinstance(decimals, dict) else decimals) for c in cols}
    upward = {c: (higher_is_better.get(c, True) if isinstance(higher_is_better, dict)
                  else higher_is_better) for c in cols}
    groups = _group_order(group_values) if group else [None]
    wanted = [str((labels or {}).get(str(o), o)) for o in order or []]
    layout = []  # (group, [labels])
    for g in groups:
        shown = list(dict.fromkeys(row_groups[g]))
        shown.sort(key=lambda lab: (wanted.index(lab) if lab in wanted else len(wanted)))
        layout.append((g, shown))
    stats = {(key, c): _mean_std(vals) for key, by_col in cells.items()
             for c, vals in by_col.items()}
    table = _Table(rows, columns, group, title, cols, layout, stats, places,
                   _ranks(stats, layout, cols, places, upward, rank_group))
    return _RENDER[fmt](table)


def _cells(selected_rows, metric, rows, columns, group, labels):
    """The values of each table cell: ``({(group, row label): {column: [values]}}, {group:
    [row labels]}, the columns in order, the groups as met)``; a row without the column axis
    (a reference method) is put in every column."""
    skip = {rows, columns, group}
    cells: dict = {}
    row_groups: dict = {}
    col_values, group_values = [], []
    everywhere = []  # rows without the column axis (a reference method): shown in every column
    done = [r for r in selected_rows if r.get("status", "done") == "done"]
    # a dataset or regime that is neither the columns nor the row groups, and differs among the
    # rows, goes into the row label: the cells would otherwise average across them
    apart = [k for k in ("dataset", "regime") if k not in skip and
             len({str(r.get(k)) for r in done if k in r}) > 1]
    for r in done:
        value = metric_value(r, metric)
        if value is None:
            continue
        try:
            grp = axis_value(r, group) if group else None
            label = _label(r, rows, skip, labels)
            if apart:
                label += " [" + ", ".join(str(r.get(k, "")) for k in apart) + "]"
            try:
                col = axis_value(r, columns)
            except KeyError:
                if columns in _PLAIN:
                    raise
                everywhere.append((grp, label, value))
                group_values.append(grp)
                row_groups.setdefault(grp, []).append(label)
                continue
        except KeyError as err:
            raise ValueError(f"a row has no {err.args[0]!r} (neither a column nor a vary key): "
                             f"{ {k: r.get(k) for k in ('run_id', 'method', 'variant')} }") \
                from None
        col_values.append(col)
        group_values.append(grp)
        row_groups.setdefault(grp, []).append(label)
        cells.setdefault((grp, label), {}).setdefault(col, []).append(value)
    if not cells and everywhere:  # every row lacks the column axis: a misspelt --columns
        varied = sorted({k for r in selected_rows for k in row_variant(r)})
        raise ValueError(f"no selected run has {columns!r}: the columns are a results column "
                         f"(dataset, regime, method, ...) or a vary key of the study "
                         f"({', '.join(varied) or 'it varies nothing'})")
    if not cells:
        raise ValueError(f"no selected run has a value for {metric!r}: nothing to tabulate")
    cols = _ordered(col_values)
    for grp, label, value in everywhere:
        for col in cols:
            cells.setdefault((grp, label), {}).setdefault(col, []).append(value)
    return cells, row_groups, cols, group_values


def _mean_std(vals) -> tuple:
    """``(mean, sample standard deviation (0 for one value), count)``."""
    n = len(vals)
    mean = sum(vals) / n
    std = math.sqrt(sum((v - mean) ** 2 for v in vals) / (n - 1)) if n > 1 else 0.0
    return mean, std, n


def _ranks(stats, layout, cols, places, upward, rank_group) -> dict:
    """``{((group, label), column): 1 | 2}``: best and second best per column among the rows of
    ``rank_group`` (all rows when it has none, or for ``None``), on the shown (rounded) means."""
    rank_keys = [(g, lab) for g, labs in layout for lab in labs
                 if rank_group is None or g == rank_group]
    if rank_group is not None and not rank_keys:
        rank_keys = [(g, lab) for g, labs in layout for lab in labs]
    ranks = {}
    for c in cols:
        shown = {k: round(stats[k, c][0], places[c]) for k in rank_keys if (k, c) in stats}
        levels = sorted(set(shown.values()), reverse=upward[c])
        if len(shown) < 2:
            continue
        for k, v in shown.items():
            if v == levels[0]:
                ranks[k, c] = 1
            elif len(levels) > 1 and v == levels[1]:
                ranks[k, c] = 2
    return ranks


@dataclass
class _Table:
    """A table ready to render: its axes, layout (``[(group, [row labels])]``), cell
    statistics ``{((group, label), column): (mean, std, n)}``, decimals per column and
    ranks."""

    rows: str
    columns: str
    group: str | None
    title: str | None
    cols: list
    layout: list
    stats: dict
    places: dict
    ranks: dict

    def text(self, key, c, pm: str) -> str | None:
        """A cell's ``mean<pm>std`` (the mean alone for one seed); None when empty."""
        if (key, c) not in self.stats:
            return None
        mean, std, n = self.stats[key, c]
        d = self.places[c]
        return f"{mean:.{d}f}" + (f"{pm}{std:.{d}f}" if n > 1 else "")

    def cell(self, key, c, pm: str, marks: dict, empty: str, escape=str) -> str:
        """A cell's text, marked when it ranks best / second (``marks``), ``empty`` if none."""
        t = self.text(key, c, pm)
        r = self.ranks.get((key, c))
        return empty if t is None else marks[r].format(escape(t)) if r else escape(t)

    def heading(self, c) -> str:
        return str(c) if self.columns in ("dataset", "regime", "method", "mode", "metric") \
            else f"{_short(self.columns)}={c}"

    def group_title(self, g) -> str:
        return REGIME_TITLES.get(g, str(g)) if self.group == "regime" else f"{self.group}={g}"

    @property
    def first(self) -> str:
        return self.rows.capitalize()


def _csv(t: _Table) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    head = [t.group or "group", t.rows] if t.group else [t.rows]
    for c in t.cols:
        h = t.heading(c)
        head += [f"{h} mean", f"{h} std", f"{h} n", f"{h} rank"]
    w.writerow(head)
    for g, labels in t.layout:
        for lab in labels:
            line = [g, lab] if t.group else [lab]
            for c in t.cols:
                s = t.stats.get(((g, lab), c))
                line += ([round(s[0], t.places[c] + 2), round(s[1], t.places[c] + 2), s[2],
                          t.ranks.get(((g, lab), c), "")] if s else ["", "", 0, ""])
            w.writerow(line)
    return buf.getvalue()


def markdown_grid(header, body) -> list[str]:
    """The lines of a Markdown table: the ``header`` cells, the rule, then each row of
    ``body`` (a list of cells); a cell None is left blank (``| |``: a row group's title row, a
    column a row has no value in). What the study tables (`study_table`) and ``spml
    benchmark``'s table (`spmlkit.experiments.benchmark.format_table`) are drawn with.

    >>> print("\\n".join(markdown_grid(["a", "b"], [["*g*", None], ["x", "1"]])))
    | a | b |
    |---|---|
    | *g* | |
    | x | 1 |
    """
    def line(cells) -> str:
        return "|" + "".join(" |" if c is None else f" {c} |" for c in cells)

    return [line(header), "|" + "---|" * len(header)] + [line(row) for row in body]


def _markdown(t: _Table) -> str:
    marks = {1: "**{}**", 2: "<u>{}</u>"}
    esc = (lambda s: str(s).replace("|", "\\|"))
    body = []
    for g, labels in t.layout:
        if t.group:
            body.append([f"*{esc(t.group_title(g))}*"] + [None] * len(t.cols))
        for lab in labels:
            body.append([esc(lab)] + [t.cell((g, lab), c, " ± ", marks, "–") for c in t.cols])
    lines = ([f"**{esc(t.title)}**", ""] if t.title else [])
    lines += markdown_grid([t.first] + [esc(t.heading(c)) for c in t.cols], body)
    return "\n".join(lines) + "\n"


def _latex(t: _Table) -> str:
    marks = {1: r"\textbf{{{}}}", 2: r"\underline{{{}}}"}
    lines = [f"% {t.title}"] if t.title else []
    lines += [r"\begin{tabular}{l" + "c" * len(t.cols) + "}", r"\toprule",
              " & ".join([latex_escape(t.first)] + [latex_escape(t.heading(c)) for c in t.cols])
              + r" \\", r"\midrule"]
    for i, (g, labels) in enumerate(t.layout):
        if t.group:
            if i:
                lines.append(r"\midrule")
            lines.append(rf"\multicolumn{{{len(t.cols) + 1}}}{{l}}"
                         rf"{{\textit{{{latex_escape(t.group_title(g))}}}}} \\")
        for lab in labels:
            out = [t.cell((g, lab), c, r" $\pm$ ", marks, "--") for c in t.cols]
            lines.append(" & ".join([latex_escape(lab)] + out) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}"]
    return "\n".join(lines) + "\n"


def _html(t: _Table) -> str:
    marks = {1: "<strong>{}</strong>", 2: "<u>{}</u>"}
    e = html.escape
    parts = ['<table class="study">']
    if t.title:
        parts.append(f"<caption>{e(t.title)}</caption>")
    parts.append("<thead><tr>" + "".join(f"<th>{e(str(h))}</th>"
                                         for h in [t.first] + [t.heading(c) for c in t.cols])
                 + "</tr></thead>")
    parts.append("<tbody>")
    for g, labels in t.layout:
        if t.group:
            parts.append(f'<tr class="group"><th colspan="{len(t.cols) + 1}">'
                         f"{e(t.group_title(g))}</th></tr>")
        for lab in labels:
            tds = []
            for c in t.cols:
                n = t.stats.get(((g, lab), c), (0, 0, 0))[2]
                body = t.cell((g, lab), c, " ± ", marks, "–", e)
                tds.append(f'<td title="{n} seed(s)">{body}</td>')
            parts.append(f'<tr><th scope="row">{e(lab)}</th>{"".join(tds)}</tr>')
    parts.append("</tbody></table>")
    return "\n".join(parts) + "\n"


_RENDER = {"csv": _csv, "markdown": _markdown, "latex": _latex, "html": _html}
