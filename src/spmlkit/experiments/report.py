"""One self-contained HTML page per study (``spml report STUDY``).

`write_report` reads a study folder through
[`spmlkit.experiments.study.open_study`][spmlkit.experiments.study.open_study] (``study.yaml``,
``results.sqlite`` restricted to the current spec's runs, ``launches.jsonl``), and the run folders'
``metrics.jsonl``, and writes ``<study>/report.html`` (``report-2.html`` when that exists, unless
``force``): the study's title and description, the paper-style tables (one per metric: the study's
own ``metric`` when it is not mAP, test mAP and, when the runs have it, the train-label recovery mAP
of Cole et al. Table 2; then, when the runs recorded them, the classic metrics of
`spmlkit.metrics.METRICS` as one table, a column each: LRAP, ranking loss, normalised
coverage, Hamming loss, one-error, ..., as ``spml study table --metric a,b`` shows them), every
run in a collapsible
table, the training curves of the selected runs per dataset, a sweep figure per reported
(``vary``) axis, the exact commands of every launch and the command that re-runs the study,
versions, wall times and the failed runs with their errors.

The page opens offline and can be mailed or moved on its own: CSS is inline, figures are PNG
data URIs (SVG figures become ``data:image/svg+xml`` URIs), no URL is loaded. Every string from
the study (method names, errors, argv, the spec) is HTML-escaped. A few lines of inline
JavaScript mark the page once it is rendered: after ``load`` every ``<img>`` must be
``complete`` with ``naturalWidth > 0`` and no ``window.onerror`` may have fired; then
``document.body.dataset.rendered`` is ``"ok"``, else ``"error: ..."`` naming what failed (the
headless-browser test reads it).

Selection follows the study contract: per (method, dataset, regime, seed, variant) the grid point
with the best val value of the spec's ``metric`` (mAP by default) among the current spec's runs
(`StudyFolder.selected`), for every table; a table cell
is the mean ± standard deviation over seeds of the selected runs. Rows of an earlier spec's runs
(the folder was re-run with a changed spec) are counted on the page, not shown.
"""
from __future__ import annotations

import base64
import html
import math
import shlex
import tempfile
from pathlib import Path

from ..runs import METRICS_FILE, read_metrics
from ..safe_write import write_output
from . import figures as fg
from .reference import reference_rows
from .study import StudyFolder, failure_groups, open_study
from .tables import row_variant

REPORT_FILE = "report.html"
#: metrics that get a main table, in this order, when at least one selected run has a value
TABLE_METRICS = (("test_map", "Test mAP"), ("train_recovery_map", "Train-label recovery mAP"))
#: the classic example-based metrics of the tabular SPML papers (SMILE, CRISP), one column each
#: of the "classic metrics" table, then the other metrics of `spmlkit.metrics.METRICS`
#: the runs recorded (all but mAP, which has its own table)
CLASSIC_METRICS = ("lrap", "ranking_loss", "coverage_norm", "hamming_loss", "one_error")
#: the per-run details table's columns
RUN_COLUMNS = ("run_id", "method", "dataset", "regime", "seed", "variant", "batch_size", "lr",
               "status", "val_map", "test_map", "train_recovery_map", "best_epoch", "seconds")


def _good(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _run_dir(study: StudyFolder, row) -> Path | None:
    """A row's run folder: ``run_dir`` as stored (absolute, or relative to the study folder or
    the working directory), else ``<study>/runs/<run_id>``."""
    candidates = []
    if row.get("run_dir"):
        p = Path(row["run_dir"])
        candidates += [p] if p.is_absolute() else [study.path / p, p]
    if row.get("run_id"):
        candidates.append(study.path / "runs" / str(row["run_id"]))
    for p in candidates:
        if (p / METRICS_FILE).is_file():
            return p
    return None


def _epochs(run_dir: Path) -> list:
    """A run's epoch records, read while it may still train (`spmlkit.runs.read_metrics`
    with ``growing``); a damaged file leaves the run out of the curves (``[]``)."""
    try:
        return read_metrics(run_dir, growing=True)
    except ValueError:
        return []


# --- labels and numbers ------------------------------------------------------------------------
def _variant_text(row) -> str:
    return ", ".join(f"{k}={_fmt_value(v)}" for k, v in sorted(row_variant(row).items()))


def _fmt_value(v) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def _row_label(row, regimes_of: dict, shown: dict | None = None) -> str:
    """Method name (as ``shown`` renames it: `StudySpec.row_labels`), ``@regime`` when
    the method appears with several regimes, and the variant."""
    label = str(row.get("method"))
    label = str((shown or {}).get(label, label))
    if len(regimes_of.get(row.get("method"), ())) > 1 and "@" not in label:
        label += f"@{row.get('regime')}"
    variant = _variant_text(row)
    return f"{label} [{variant}]" if variant else label


def _fmt(v, digits: int = 2) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return "nan" if math.isnan(v) else f"{v:.{digits}f}"
    return str(v)


def _fmt_seconds(s) -> str:
    if not _good(s):
        return ""
    s = float(s)
    if s < 60:
        return f"{s:.1f} s"
    if s < 3600:
        return f"{s / 60:.1f} min"
    return f"{s / 3600:.2f} h"


def _esc(v) -> str:
    return html.escape("" if v is None else str(v), quote=True)


def _modes_text(spec) -> str:
    """``mode linear`` and, for methods trained in another mode, ``(SMILE: smile)``."""
    own = [f"{m.label}: {spec.method_mode(m)}" for m in spec.methods
           if spec.method_mode(m) != spec.mode]
    return f"mode {spec.mode}" + (f" ({'; '.join(own)})" if own else "")


# --- tables ------------------------------------------------------------------------------------
def _method_order(study: StudyFolder) -> list:
    """The spec's method labels in its order (the table's row order, as in the papers)."""
    return [m.label for m in study.spec.methods]


def pivot_axis(study: StudyFolder) -> str | None:
    """The vary axis a study's tables take as their columns (its first), or None: a study that
    varies a setting is shown as a method x setting table, not one row per (method, value)."""
    return next(iter(study.spec.vary), None)


def _main_table(selected, metric: str, title: str, order=None, labels=None,
                pivot: str | None = None, datasets: int = 1) -> str:
    from .tables import study_table

    if pivot:  # methods x the axis' values; one row group per dataset when there are several
        return str(study_table(selected, fmt="html", metric=metric, title=title, order=order,
                               labels=labels, columns=pivot,
                               group="dataset" if datasets > 1 else None))
    return str(study_table(selected, fmt="html", metric=metric, title=title, order=order,
                           labels=labels))


def _metric_name(name: str) -> str:
    return "mAP" if name == "map" else name


def _recorded(selected, name: str) -> bool:
    """Whether a selected run has a test value of metric ``name`` (runs from before the classic
    metrics were recorded have none)."""
    from .tables import metric_column, metric_value

    column = metric_column(name)
    return any(metric_value(r, column) is not None for r in selected)


def classic_columns(study: StudyFolder) -> list:
    """The metrics of the report's classic-metrics table: `CLASSIC_METRICS` and then the
    rest of `spmlkit.metrics.METRICS` but mAP (the study's own metric first when it is
    one of them), those the selected runs recorded."""
    from ..metrics import METRICS

    names = [n for n in dict.fromkeys([study.spec.metric, *CLASSIC_METRICS, *METRICS])
             if n != "map"]
    return [n for n in names if _recorded(study.selected, n)]


def _metric_table(study: StudyFolder, name: str, title: str) -> str:
    """The html table of one metric of `spmlkit.metrics.METRICS` (test values of the
    selected runs, marked in the metric's direction)."""
    from ..metrics import METRICS
    from .tables import metric_column, study_table

    return str(study_table(study.selected, fmt="html", metric=metric_column(name), title=title,
                           order=_method_order(study), labels=study.spec.row_labels(),
                           decimals=METRICS[name].decimals,
                           higher_is_better=METRICS[name].higher_is_better))


def _classic_table(study: StudyFolder, names, title: str) -> str:
    from .tables import metrics_table

    return str(metrics_table(study.selected, names, "html", title=title,
                             order=_method_order(study), labels=study.spec.row_labels()))


def _runs_table(study: StudyFolder) -> str:
    chosen = {r.get("run_id") for r in study.selected}
    head = "".join(f"<th>{_esc(c)}</th>" for c in RUN_COLUMNS) + "<th>selected</th>"
    body = []
    for r in study.rows:
        tds = []
        for c in RUN_COLUMNS:
            v = _variant_text(r) if c == "variant" else r.get(c)
            if c == "seconds":
                v = _fmt_seconds(v)
            elif c == "lr" and _good(v):
                v = f"{v:g}"
            tds.append(f"<td>{_esc(_fmt(v))}</td>")
        cls = ' class="failed"' if r.get("status") == "failed" else ""
        mark = "✓" if r.get("run_id") in chosen else ""
        body.append(f"<tr{cls}>{''.join(tds)}<td>{mark}</td></tr>")
    return (f'<table class="runs"><thead><tr>{head}</tr></thead>'
            f"<tbody>{''.join(body)}</tbody></table>")


# --- figures -----------------------------------------------------------------------------------
def _mean_records(study: StudyFolder, rows) -> list:
    """The rows' ``metrics.jsonl`` records averaged per epoch over the runs (seeds) found;
    ``[]`` when no run folder is there."""
    per_epoch: dict = {}
    for r in rows:
        run = _run_dir(study, r)
        if run is None:
            continue
        for i, rec in enumerate(_epochs(run), 1):
            slot = per_epoch.setdefault(i, {})
            for key in (curve_key(study), "train_loss"):
                if _good(rec.get(key)):
                    slot.setdefault(key, []).append(float(rec[key]))
    return [{"epoch": e, **{k: sum(v) / len(v) for k, v in per_epoch[e].items()}}
            for e in sorted(per_epoch) if per_epoch[e]]


def curve_key(study: StudyFolder) -> str:
    """The per-epoch record the report's curves draw: the val value of the metric the study
    selects on (``val_map``, ``val_lrap``, ...)."""
    metric = study.spec.metric
    return "val_map" if metric == "map" else f"val_{metric}"


def _curves(study: StudyFolder, rows) -> dict:
    """Legend label (method, regime when it varies, variant) -> mean epoch records."""
    regimes_of = {}
    for r in study.selected:
        regimes_of.setdefault(r.get("method"), set()).add(r.get("regime"))
    groups: dict = {}
    for r in rows:
        groups.setdefault(_row_label(r, regimes_of, study.spec.row_labels()), []).append(r)
    curves = {}
    for label, members in groups.items():
        records = _mean_records(study, members)
        if any(curve_key(study) in rec for rec in records):
            curves[label] = records
    return curves


#: up to this many curves in one panel; more are drawn as small multiples, a panel per method
CURVES_IN_ONE_PANEL = 8


def _curve_panels(study: StudyFolder, rows) -> dict:
    """Method label -> {variant text (or the label) -> mean epoch records}: the small
    multiples of a study with many curves (one panel per method, its variants in it)."""
    shown = study.spec.row_labels()
    panels: dict = {}
    for r in rows:
        method = str(shown.get(str(r.get("method")), r.get("method")))
        panels.setdefault(method, {}).setdefault(_variant_text(r) or method, []).append(r)
    out: dict = {}
    for method in [*_method_order(study), *panels]:
        method = str(shown.get(method, method))
        if method not in panels or method in out:
            continue
        lines = {}
        for label, members in sorted(panels[method].items(),
                                     key=lambda kv: _natural_key(kv[0])):
            records = _mean_records(study, members)
            if any(curve_key(study) in rec for rec in records):
                lines[label] = records
        if lines:
            out[method] = lines
    return out


def _natural_key(text: str) -> list:
    from .tables import _natural

    return _natural(text)


def build_figures(study: StudyFolder, folder) -> list:
    """Draw the report's figures into ``folder`` with `spmlkit.experiments.figures`: the
    training curves of the selected runs per dataset (mean over seeds; more than
    `CURVES_IN_ONE_PANEL` curves as small multiples, one panel per method with its
    variants) and a sweep per vary axis (``data.subsample`` against the number of observed
    training labels on a log axis, as Cole et al. Fig. 1 draws it). Returns
    ``[(caption, path), ...]``."""
    folder = Path(folder)
    figures = []
    by_dataset: dict = {}
    for r in study.selected:
        by_dataset.setdefault(str(r.get("dataset")), []).append(r)
    for i, (dataset, rows) in enumerate(by_dataset.items()):
        curves = _curves(study, rows)
        if len(curves) > CURVES_IN_ONE_PANEL:
            panels = _curve_panels(study, rows)
            caption = (f"Validation {_metric_name(study.spec.metric)} per epoch of the "
                       f"selected runs, {dataset} (mean over seeds): one panel per method"
                       + (", its variants in it" if any(len(v) > 1 for v in panels.values())
                          else ", the other methods in grey"))
            figures.append((caption, fg.plot_small_curves(
                panels, folder / f"curves-{i}.png", curve_key(study),
                title=f"{dataset}: selected runs")))
        elif curves:
            caption = f"Training curves of the selected runs, {dataset} (mean over seeds)"
            figures.append((caption, fg.plot_curves(curves, folder / f"curves-{i}.png",
                                                    curve_key(study),
                                                    title=f"{dataset}: selected runs")))
    for i, axis in enumerate(study.spec.vary):
        x = fg.default_x(axis)
        try:
            lines = fg.sweep_points(study.selected, axis, x=x)
        except ValueError:  # no finished run varies this axis yet
            continue
        if x == fg.TRAIN_LABELS:
            path = fg.plot_sweep(lines, axis, folder / f"sweep-{i}.png", title=study.title,
                                 logx=True, xlabel=fg.TRAIN_LABELS_XLABEL)
            caption = (f"Selected test mAP (mean ± std over seeds) against the number of "
                       f"observed training labels (log axis), each point one value of {axis}")
        elif x:
            logx, xlabel = fg.x_layout(x)
            path = fg.plot_sweep(lines, axis, folder / f"sweep-{i}.png", title=study.title,
                                 logx=logx, xlabel=xlabel)
            caption = f"Selected test mAP (mean ± std over seeds) against {xlabel}"
        else:
            path = fg.plot_sweep(lines, axis, folder / f"sweep-{i}.png",
                                 title=f"{study.title}: sensitivity to {axis}")
            caption = f"Sensitivity to {axis}: selected test mAP, mean ± std over seeds"
        figures.append((caption, path))
    return figures


def _data_uri(path: Path) -> str:
    path = Path(path)
    suffix = path.suffix.lower()
    mime = {".png": "image/png", ".svg": "image/svg+xml", ".jpg": "image/jpeg",
            ".jpeg": "image/jpeg"}.get(suffix)
    if mime is None:
        raise ValueError(f"cannot embed figure {path}: expected .png, .svg or .jpg")
    return f"data:{mime};base64," + base64.b64encode(path.read_bytes()).decode("ascii")


# --- commands, versions, wall times ------------------------------------------------------------
def _command(argv, cwd=None) -> str:
    """A launch's command line as a user types it: ``spml ...`` for the console script and
    for ``python -m spmlkit`` (whose argv[0] is the package's ``__main__.py``, not runnable as
    a file), after ``cd CWD &&`` when the launch recorded its folder (relative paths)."""
    if isinstance(argv, str):
        return argv
    if not isinstance(argv, (list, tuple)):  # a launches.jsonl line edited or damaged
        return repr(argv)
    argv = [str(a) for a in argv]
    if argv and (Path(argv[0]).name == "spml" or Path(argv[0]).parts[-2:] == ("spmlkit",
                                                                                "__main__.py")):
        argv[0] = "spml"
    command = shlex.join(argv)
    return f"cd {shlex.quote(str(cwd))} && {command}" if cwd else command


def _failures(launch) -> str:
    f = launch.get("failures")
    if isinstance(f, list):
        return str(len(f))
    return _fmt(f)


def _launches_table(launches) -> str:
    cols = ("started", "finished", "runs_total", "runs_run", "failures", "jobs", "seconds")
    head = "".join(f"<th>{c}</th>" for c in ("#",) + cols + ("command",))
    body = []
    for i, launch in enumerate(launches, 1):
        tds = [f"<td>{i}</td>"]
        for c in cols:
            v = (_failures(launch) if c == "failures" else
                 _fmt_seconds(launch.get(c)) if c == "seconds" else _fmt(launch.get(c)))
            tds.append(f"<td>{_esc(v)}</td>")
        tds.append(f"<td><code>{_esc(_command(launch.get('argv')))}</code></td>")
        body.append(f"<tr>{''.join(tds)}</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def rerun_command(study: StudyFolder) -> str:
    """The command that re-runs (resumes) the study: its last launch's argv, else
    ``spml study <folder>/study.yaml``."""
    for launch in reversed(study.read_launches()):
        if launch.get("argv"):
            return _command(launch["argv"], launch.get("cwd"))
    return shlex.join(["spml", "study", str(study.path / "study.yaml")])


def _versions(study: StudyFolder) -> dict:
    """Package -> the versions seen across launches (in launch order)."""
    seen: dict = {}
    for launch in study.read_launches():
        versions = launch.get("versions")
        if not isinstance(versions, dict):  # an edited or damaged line: nothing to read
            continue
        for pkg, v in versions.items():
            values = seen.setdefault(str(pkg), [])
            if str(v) not in values:
                values.append(str(v))
    return seen


# --- the page ----------------------------------------------------------------------------------
_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:2em auto;
max-width:1200px;padding:0 1em;color:#222;line-height:1.4}
h1{margin-bottom:.2em}h2{border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:1.6em}
.meta{color:#555}table{border-collapse:collapse;margin:.6em 0;font-size:.92em}
th,td{border:1px solid #ccc;padding:.25em .55em;text-align:left;vertical-align:top}
thead th{background:#f0f3f7}table.main td{text-align:right;font-variant-numeric:tabular-nums}
table.runs td{font-variant-numeric:tabular-nums}tr.failed td{background:#fde8e8}
figure{margin:1em 0}figure img{max-width:100%;border:1px solid #eee}
figcaption{color:#555;font-size:.9em}pre,code{font-family:ui-monospace,Menlo,Consolas,monospace;
font-size:.9em}pre{background:#f6f8fa;padding:.6em;overflow-x:auto;white-space:pre-wrap}
details{margin:.6em 0}summary{cursor:pointer;font-weight:600}.error{color:#a00}
"""

# runs before the body: records script errors; after load checks every image
_JS = """
window.__reportErrors = [];
window.onerror = function (msg) { window.__reportErrors.push(String(msg)); };
window.addEventListener("load", function () {
  var problems = window.__reportErrors.slice();
  var imgs = document.getElementsByTagName("img");
  for (var i = 0; i < imgs.length; i++) {
    if (!(imgs[i].complete && imgs[i].naturalWidth > 0)) {
      problems.push("image not rendered: " + (imgs[i].alt || "#" + i));
    }
  }
  document.body.dataset.rendered = problems.length ? "error: " + problems.join("; ") : "ok";
});
"""


def render_html(study: StudyFolder, figures=()) -> str:
    """The report page as one HTML string (``figures``: ``[(caption, path)]``, embedded)."""
    parts = []
    add = parts.append
    counts = study.status()
    failed = study.failed
    launches = study.read_launches()
    datasets = [d.name for d in study.spec.datasets]
    add(f"<h1>{_esc(study.title)}</h1>")
    add(f'<p class="meta">study <code>{_esc(study.name)}</code> · folder '
        f"<code>{_esc(study.path)}</code> · {_esc(_modes_text(study.spec))} · "
        f"{counts['total']} runs ({counts['done']} done, {counts['failed']} failed, "
        f"{counts['missing']} not run) · datasets: {_esc(', '.join(datasets))}</p>")
    if study.stale:
        add(f'<p class="meta" id="stale">{len(study.stale)} stored run(s) of an earlier version '
            f"of the spec are left out of this page (<code>spml study export "
            f"{_esc(study.path)} --all</code> lists them).</p>")
    if study.spec.description:
        add(f"<p>{_esc(study.spec.description)}</p>")

    add('<section id="tables"><h2>Results</h2>')
    if not study.selected:
        add("<p>No finished run yet.</p>")
    chosen = _metric_name(study.spec.metric)
    add(f"<p>Per method, dataset, regime, seed and variant the grid point with the best "
        f"validation {_esc(chosen)} is selected; cells are mean ± standard deviation over "
        f"seeds of the selected runs' test values.</p>")
    own = study.spec.metric
    if study.selected and own != "map" and _recorded(study.selected, own):
        title = f"Test {own} (the study's metric)"
        add(f'<h3 id="table-test_{_esc(own)}">{_esc(title)}</h3>')
        add(_metric_table(study, own, title))
    for metric, title in TABLE_METRICS:
        if study.selected and any(_good(r.get(metric)) for r in study.selected):
            add(f'<h3 id="table-{metric}">{_esc(title)}</h3>')
            add(_main_table(study.selected + reference_rows(study.path, metric), metric, title,
                            _method_order(study), study.spec.row_labels(), pivot_axis(study),
                            len(study.spec.datasets)))
    classic = classic_columns(study) if study.selected else []
    if classic:
        title = f"Classic metrics (test; selected on val {chosen})"
        add(f'<h3 id="table-classic">{_esc(title)}</h3>')
        add("<p>Example-based ranking metrics (label-ranking average precision, ranking loss, "
            "normalised coverage, one-error) and the threshold metrics (Hamming loss, F1) at "
            "each run's global threshold chosen on val (the one that maximises val micro-F1, "
            "the threshold spml predict applies), not at 0.5; the best value of each column is "
            "marked in its own direction (lower is better for the losses, coverage and "
            "one-error).</p>")
        add(_classic_table(study, classic, title))
    add("</section>")

    add('<section id="figures"><h2>Figures</h2>')
    if not figures:
        add("<p>No figure: no run folder with per-epoch records was found.</p>")
    for caption, path in figures:
        add(f'<figure><img src="{_data_uri(path)}" alt="{_esc(caption)}">'
            f"<figcaption>{_esc(caption)}</figcaption></figure>")
    add("</section>")

    add('<section id="failures"><h2>Failures</h2>')
    if failed:  # one entry per distinct traceback, with the runs that share it
        by_id = {r.get("run_id"): r for r in failed}
        groups = failure_groups(failed)
        add(f"<p>{len(failed)} failed run(s), {len(groups)} distinct error(s), the most "
            f"common first.</p><ul>")
        for g in groups:
            runs = []
            for run_id in g["run_ids"]:
                r = by_id.get(run_id, {})
                runs.append(f'<code>{_esc(run_id)}</code> ({_esc(r.get("method"))}, '
                            f'{_esc(r.get("dataset"))}, seed {_esc(r.get("seed"))}, batch '
                            f'{_esc(r.get("batch_size"))}, lr '
                            f'{_esc(_fmt_value(r.get("lr")))})')
            add(f'<li class="failure-group"><b>{g["count"]} run(s)</b>: '
                f'<code>{_esc(g["reason"])}</code><details><summary>runs</summary>'
                f'{"<br>".join(runs)}</details>'
                f'<pre class="error">{_esc(g["error"])}</pre></li>')
        add("</ul>")
    else:
        add("<p>None.</p>")
    add("</section>")

    add('<section id="runs"><h2>Runs</h2>')
    add(f"<details><summary>All {len(study.rows)} runs (✓: selected on val "
        f"{_esc(_metric_name(study.spec.metric))})</summary>")
    add(_runs_table(study))
    add("</details></section>")

    add('<section id="commands"><h2>Commands</h2>')
    add(f'<p>Re-run with (finished runs are kept, the rest resumes):</p>'
        f'<pre id="rerun">{_esc(rerun_command(study))}</pre>')
    if launches:
        add(_launches_table(launches))
    else:
        add("<p>No launch recorded (launches.jsonl is missing).</p>")
    total = sum(float(x["seconds"]) for x in launches if _good(x.get("seconds")))
    compute = sum(float(r["seconds"]) for r in study.rows if _good(r.get("seconds")))
    add(f'<p id="walltime">Wall time over all launches: {_esc(_fmt_seconds(total) or "-")}; '
        f"training time summed over runs: {_esc(_fmt_seconds(compute) or '-')}.</p>")
    add(f"<details><summary>study.yaml (resolved spec)</summary>"
        f"<pre>{_esc(study.spec_text)}</pre></details>")
    add("</section>")

    add('<section id="versions"><h2>Versions</h2>')
    versions = _versions(study)
    if versions:
        add("<table><thead><tr><th>package</th><th>version</th></tr></thead><tbody>")
        for pkg, vs in versions.items():
            add(f"<tr><td>{_esc(pkg)}</td><td>{_esc(' → '.join(vs))}</td></tr>")
        add("</tbody></table>")
    else:
        add("<p>Not recorded.</p>")
    add("</section>")

    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<title>{_esc(study.title)}</title><style>{_CSS}</style>"
            f"<script>{_JS}</script></head>\n<body>\n" + "\n".join(parts) + "\n</body></html>\n")


def write_report(study_dir, out=None, *, force: bool = False) -> Path:
    """Write the study's self-contained HTML report; returns the path written.

    Args:
        study_dir: a study folder (``study.yaml``, ``results.sqlite``, ``launches.jsonl``,
            ``runs/<run_id>/metrics.jsonl``), read by `open_study`.
        out: the HTML file to write (default ``<study_dir>/report.html``). An existing file
            is an error (`spmlkit.safe_write.write_output`).
        force: replace an existing ``out`` (a regular file; never a link, a device, a FIFO,
            a folder, a run's or study's own file).

    Raises:
        FileNotFoundError: ``study_dir`` or its ``study.yaml`` is missing.
        ValueError: ``study.yaml``, ``launches.jsonl`` or ``results.sqlite`` cannot be read.
        ModuleNotFoundError: a figure is needed and matplotlib is not installed.
    """
    study = open_study(study_dir)
    out = Path(out) if out is not None else study.path / REPORT_FILE
    with tempfile.TemporaryDirectory(prefix="spml-report-") as tmp:
        page = render_html(study, build_figures(study, tmp))
    return write_output(out, page, force=force)
