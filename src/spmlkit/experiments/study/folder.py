"""Reading a study folder against its current spec
([`open_study`][spmlkit.experiments.study.folder.open_study])."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ...runs import json_lines
from ..store import StudyStore
from .expand import expand
from .layout import LAUNCHES_FILE, RESULTS_FILE, SPEC_FILE, STUDIES_ROOT
from .loading import load_study
from .spec import StudySpec


def failure_groups(rows) -> list[dict]:
    """The failed rows among ``rows`` grouped by their error: one group per identical
    traceback (compared with the run's own id taken out, so a path through its run folder does
    not split a group), the most common first.

    Returns:
        ``[{"reason", "count", "run_ids", "error"}]``: ``reason`` is the error's last line
        (the exception and its message), ``error`` the first run's full text.

    >>> rows = [{"run_id": f"r{i}", "status": "failed", "error": "Traceback ...\\nValueError: "
    ...          "dataset 'voc' needs the option(s) root"} for i in range(3)]
    >>> [(g["count"], g["reason"]) for g in failure_groups(rows)]
    [(3, "ValueError: dataset 'voc' needs the option(s) root")]
    """
    groups: dict = {}
    for row in rows:
        if row.get("status") != "failed":
            continue
        text = str(row.get("error") or "no error recorded")
        run_id = str(row.get("run_id") or "")
        key = text.replace(run_id, "<run>") if run_id else text
        if key not in groups:
            lines = [line.strip() for line in text.splitlines() if line.strip()]
            groups[key] = {"reason": lines[-1] if lines else text, "count": 0, "run_ids": [],
                           "error": text}
        groups[key]["count"] += 1
        groups[key]["run_ids"].append(run_id)
    return sorted(groups.values(), key=lambda g: -g["count"])



def study_folder(out) -> Path:
    """The study folder ``out`` names: the folder itself, or, for a bare name that is no folder
    here, ``runs/studies/<name>`` (where ``spml study run`` puts a study by its name), so
    that ``spml study table yeast-papers`` reads what ``spml study run yeast-papers`` wrote."""
    out = Path(out)
    if not out.exists() and len(out.parts) == 1 and (STUDIES_ROOT / out).is_dir():
        return STUDIES_ROOT / out
    return out


def study_spec(out) -> StudySpec:
    """The spec of the study folder ``out`` (its ``study.yaml``, validated; a bare name: see
    `study_folder`).

    Raises:
        FileNotFoundError: ``out`` does not exist, or has no ``study.yaml`` (not a study
            folder).
        ValueError: ``study.yaml`` is not a valid spec (the file and key are named).
    """
    out = study_folder(out)
    if not out.is_dir():
        raise FileNotFoundError(f"study folder {out} does not exist (give the folder `spml study "
                                f"run` wrote, {STUDIES_ROOT}/<name> by default)")
    if not (out / SPEC_FILE).is_file():
        raise FileNotFoundError(f"{out / SPEC_FILE} is missing: {out} is not a study folder "
                                f"(`spml study run` writes it)")
    return load_study(out / SPEC_FILE)


@dataclass
class StudyFolder:
    """A study folder read against its current spec: what
    [`open_study`][spmlkit.experiments.study.folder.open_study] returns, and the one view of a
    study's results that ``spml study status | table | export``, ``spml report`` and ``spml figure
    sweep`` share.

    A run id hashes the run's whole configuration, so a folder re-run with a changed spec
    (``--set epochs=3``, another grid) holds rows of the earlier spec's runs too. Those are
    ``stale``: kept in ``results.sqlite`` and counted, but in no table, figure, selection or
    default export.

    Attributes:
        path: the folder.
        spec: its validated spec (``study.yaml``); ``spec_text`` the file as written.
        run_ids: the current spec's run ids, in expansion order.
        rows: the stored rows of those runs (any status), ordered by run id.
        selected: per (method, dataset, regime, seed, variant) the finished row of ``rows``
            with the best val value of the spec's ``metric`` (mAP by default;
            `spmlkit.experiments.store.select_best`).
        stale: the stored rows of runs the current spec does not have.
        has_results: whether ``results.sqlite`` exists (the study has run).
    """

    path: Path
    spec: StudySpec
    spec_text: str
    run_ids: list
    rows: list
    selected: list
    stale: list
    has_results: bool

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def title(self) -> str:
        return self.spec.title or self.spec.name

    @property
    def results_path(self) -> Path:
        return self.path / RESULTS_FILE

    @property
    def failed(self) -> list:
        """The current spec's failed rows."""
        return [r for r in self.rows if r.get("status") == "failed"]

    def status(self) -> dict:
        """Counts against the spec: ``total``, ``done``, ``failed``, ``missing`` (not run yet,
        or killed), ``stale`` (stored rows of runs the current spec no longer has)."""
        done = sum(r.get("status") == "done" for r in self.rows)
        failed = len(self.failed)
        return {"name": self.name, "title": self.title, "total": len(self.run_ids),
                "done": done, "failed": failed, "missing": len(self.run_ids) - done - failed,
                "stale": len(self.stale)}

    def read_launches(self) -> list:
        """The records of ``launches.jsonl`` (one per launch, oldest first; ``[]`` without the
        file). ``ValueError`` names a line that is not JSON."""
        path = self.path / LAUNCHES_FILE
        if not path.is_file():
            return []
        return [record for _, record in json_lines(path) if isinstance(record, dict)]

    def export(self, path, fmt: str = "csv", *, selected: bool = False,
               include_stale: bool = False, force: bool = False) -> Path:
        """Write the current spec's rows (or the selected ones, with the scikit-learn rows of a
        study run with ``sklearn_reference: true``, as its tables show them; or, with
        ``include_stale``, every stored row) as ``csv`` / ``json`` / ``markdown`` / ``latex``
        (`spmlkit.experiments.store.format_rows`) to ``path``, atomically; an existing
        file is an error unless ``force`` (`spmlkit.safe_write.write_output`). Returns the path
        written.
        """
        from ...safe_write import write_output
        from ..store import format_rows

        if selected and include_stale:
            raise ValueError("selected rows are chosen among the current spec's runs: ask for "
                             "the selected rows or for every stored row, not both")
        if selected:
            from ..reference import reference_rows

            rows = self.selected + reference_rows(self.path)
        elif include_stale:
            rows = sorted(self.rows + self.stale, key=lambda r: r["run_id"])
        else:
            rows = self.rows
        return write_output(path, format_rows(rows, fmt), force=force)


def open_study(out) -> StudyFolder:
    """Read a study folder against its current spec (see `StudyFolder`): ``study.yaml``,
    and ``results.sqlite`` when the study has run (a folder without it has no rows).

    Raises:
        FileNotFoundError: the folder or its ``study.yaml`` is missing.
        ValueError: ``study.yaml`` is not a valid spec, or ``results.sqlite`` cannot be read.
    """
    from ..store import select_best

    out = study_folder(out)
    spec = study_spec(out)
    text = (out / SPEC_FILE).read_text(encoding="utf-8")
    run_ids = [t.run_id for t in expand(spec)]
    db = out / RESULTS_FILE
    # read-only (a study on a read-only disk reads; nothing is created next to the store);
    # a folder, a link, an empty file there: refused
    stored = StudyStore(db, read_only=True).rows() if os.path.lexists(db) else []
    current = set(run_ids)
    rows = by_dataset_entry(spec, [r for r in stored if r["run_id"] in current])
    stale = [r for r in stored if r["run_id"] not in current]
    return StudyFolder(out, spec, text, run_ids, rows, select_best(rows, spec.metric), stale,
                       db.is_file())


def by_dataset_entry(spec: StudySpec, rows: list) -> list:
    """``rows`` with the ``dataset`` of a source the spec lists more than once (yeast, and
    yeast with ``protocol: tabular``) named by its entry: ``yeast (protocol=tabular)``, so that
    the entries get columns of their own and a grid point selected within each (their runs
    were pooled, one grid point selected across them). A row belongs to the entry whose
    options its ``dataset_options`` hold, the most specific one; run ids and the store are
    unchanged."""
    import json

    names = [d.name for d in spec.datasets]
    twice = {n for n in names if names.count(n) > 1}
    if not twice:
        return rows
    # an option a data.* axis sets is the run's, whatever the entry said
    varied = {k[5:] for k in [*spec.vary, *spec.grid] if k.startswith("data.")}
    out = []
    for r in rows:
        if r.get("dataset") in twice:
            config = r.get("config")
            config = json.loads(config) if isinstance(config, str) else (config or {})
            given = config.get("dataset_options") or {}
            entries = [d for d in spec.datasets if d.name == r["dataset"] and
                       all(given.get(k) == v for k, v in d.options.items() if k not in varied)]
            if entries:
                d = max(entries, key=lambda e: len(set(e.options) - varied))
                r = {**r, "dataset": spec.dataset_label(d)}
        out.append(r)
    return out


def study_status(out) -> dict:
    """`StudyFolder.status` of the study folder ``out``."""
    return open_study(out).status()


def study_rows(out) -> tuple[StudySpec, list[dict]]:
    """A study folder's spec and its selected rows (best val per group among the current
    spec's runs; [`open_study`][spmlkit.experiments.study.folder.open_study])."""
    study = open_study(out)
    return study.spec, study.selected

