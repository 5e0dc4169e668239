"""The results store of a study: one SQLite file, one row per run (grid point).

``StudyStore(path)`` opens (and creates) ``results.sqlite``: table ``runs`` with the columns of
`COLUMNS` (``run_id`` is the primary key). SQLite in WAL mode with a busy timeout; every
write is one short transaction on its own connection, so several processes may write to the same
file at once (the study runner writes from its parent process as results come back, but nothing
relies on that). Only the standard library is used (``sqlite3``), so this module imports in
milliseconds.

Selection (`select_best`, `StudyStore.selected`) follows the papers' protocol: per
(method, dataset, regime, seed, variant) the finished run with the best val mAP; failed runs and
NaN val mAPs are never chosen (SQLite stores NaN as NULL); the first run id wins a tie. The store
knows no spec: a study folder is read through
[`spmlkit.experiments.study.open_study`][spmlkit.experiments.study.open_study], which keeps the
current spec's runs.

>>> import tempfile, os
>>> store = StudyStore(os.path.join(tempfile.mkdtemp(), "results.sqlite"))
>>> for rid, lr, val in [("a", 1e-3, 50.0), ("b", 1e-2, 55.0), ("c", 1e-4, float("nan"))]:
...     store.put({"run_id": rid, "method": "an", "dataset": "yeast", "regime": "1p", "seed": 0,
...                "lr": lr, "status": "done", "val_map": val, "test_map": val - 10})
>>> [(r["run_id"], r["test_map"]) for r in store.selected()]
[('b', 45.0)]
>>> len(store.rows(method="an")), store.counts()
(3, {'done': 3})
"""
from __future__ import annotations

import csv
import errno
import io
import json
import math
import os
import sqlite3
import stat
import time
from pathlib import Path

#: the ``runs`` table's columns, in order (the study contract)
COLUMNS = ("run_id", "study", "method", "loss", "dataset", "regime", "seed", "variant",
           "batch_size", "lr", "mode", "status", "val_map", "test_map", "train_recovery_map",
           "best_epoch", "seconds", "metrics", "config", "run_dir", "error", "finished_at")
_TYPES = {"seed": "INTEGER", "batch_size": "INTEGER", "best_epoch": "INTEGER", "lr": "REAL",
          "val_map": "REAL", "test_map": "REAL", "train_recovery_map": "REAL", "seconds": "REAL"}
#: the selection groups: one selected run per value of these columns
GROUP = ("method", "dataset", "regime", "seed", "variant")
STATUSES = ("done", "failed")
#: columns that hold JSON text
JSON_COLUMNS = ("variant", "metrics", "config")
#: columns shown by the Markdown / LaTeX exports (the JSON blobs are left to csv / json)
BRIEF_COLUMNS = ("run_id", "method", "dataset", "regime", "seed", "variant", "batch_size", "lr",
                 "status", "val_map", "test_map", "train_recovery_map", "best_epoch", "seconds")
EXPORT_FORMATS = ("csv", "markdown", "latex", "json")

_SCHEMA = ("CREATE TABLE IF NOT EXISTS runs ("
           + ", ".join(f"{c} {'TEXT PRIMARY KEY' if c == 'run_id' else _TYPES.get(c, 'TEXT')}"
                       for c in COLUMNS) + ")")


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _cell(column: str, value):
    """A Python value as stored: JSON columns as text, NaN / inf as NULL."""
    if value is None:
        return None
    if column in JSON_COLUMNS and not isinstance(value, str):
        return json.dumps(value, sort_keys=column == "variant", default=str)
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):  # numpy scalars
        return value.item()
    return value


def _group_key(row: dict) -> tuple:
    """Sort key of a selection group: numbers as numbers, no variant before any variant."""
    return tuple((0, row[c], "") if isinstance(row[c], (int, float)) else
                 (1, 0, "" if row[c] in (None, "{}") else str(row[c])) for c in GROUP)


def _check_own_file(path: Path) -> None:
    """`spmlkit.safe_write.check_own_file` (a link, a device, a FIFO where the store keeps a
    file is refused, never opened through), repeated here: this module imports only the
    standard library (a worker loads it alone)."""
    try:
        mode = os.lstat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return
    if not stat.S_ISREG(mode):
        what = ("a symbolic link" if stat.S_ISLNK(mode) else "a FIFO (named pipe)"
                if stat.S_ISFIFO(mode) else "a device" if stat.S_ISCHR(mode) or
                stat.S_ISBLK(mode) else "not a regular file")
        raise FileExistsError(errno.EEXIST, f"is {what} where spmlkit keeps its own file; "
                              f"spmlkit never writes through or over it (was this folder "
                              f"handed to you? remove it, or start a new folder)", str(path))


#: below this many free bytes a "disk I/O error" of SQLite is a full disk (its -wal / -shm
#: files could not grow)
_FULL_BELOW = 1 << 20


def _free_bytes(path: Path) -> int:
    """Free bytes on the disk of ``path``'s folder (a large number when it cannot be told)."""
    import shutil

    try:
        return int(shutil.disk_usage(path.parent if path.parent.exists() else ".").free)
    except OSError:
        return 1 << 62


def _full_disk(path: Path, err: Exception) -> None:
    """A full disk (or a read-only one) is said as such, naming the store, never called damage:
    the transaction was rolled back, the store is as it was."""
    text = str(err).lower()
    if "disk i/o error" in text and _free_bytes(path) < _FULL_BELOW:
        # opening: SQLite cannot grow its -wal / -shm files on a full disk and says "disk I/O
        # error"; nothing was written, the file was not damaged
        raise OSError(errno.ENOSPC, f"No space left on the disk ({_free_bytes(path)} bytes "
                      f"free; SQLite: {err}); the store is unchanged: free space and re-run the "
                      f"same command", str(path)) from None
    if "disk i/o error" in text:
        raise OSError(errno.EIO, f"the disk reported an input/output error (SQLite: {err}), "
                      f"not a sign of a damaged store: check the disk, then re-run the same "
                      f"command", str(path)) from None
    if "disk is full" in text:
        raise OSError(errno.ENOSPC, f"No space left on the disk (SQLite: {err}); the store is "
                      f"unchanged (the write was rolled back): free space and re-run the same "
                      f"command", str(path)) from None
    if "readonly" in text or "read-only" in text:
        raise OSError(errno.EROFS, f"cannot be written: the folder or its disk is read-only "
                      f"(SQLite: {err}); the store is unchanged", str(path)) from None


class StudyStore:
    """One study's ``results.sqlite`` (see the module docstring).

    Args:
        path: the SQLite file; created with its folder and the ``runs`` table when missing.
        timeout: seconds a writer waits for another one's lock (SQLite's busy timeout).

        read_only: only read: the file must exist and hold the ``runs`` table; opened
            read-only (SQLite ``mode=ro``, or ``immutable=1`` where the folder cannot be
            written, e.g. a read-only disk), so nothing is created next to it.

    Raises:
        ValueError: the file cannot be opened, or is not an SQLite database (damaged, or another
            file under that name), or (``read_only``) is empty or has no ``runs`` table; the
            message names it.
        FileExistsError: the file (or its ``-wal`` / ``-shm`` / ``-journal`` side file) is a
            link, a device, a FIFO: never opened through (`spmlkit.safe_write.check_own_file`).
    """

    def __init__(self, path, timeout: float = 60.0, *, read_only: bool = False):
        self.path = Path(path)
        self.timeout = float(timeout)
        self.read_only = read_only
        self._uri = None
        if self.path.is_dir() and not self.path.is_symlink():
            raise ValueError(f"{self.path} is a folder, not a results store (an SQLite file); "
                             f"move it aside")
        for side in ("", "-wal", "-shm", "-journal"):  # SQLite writes them all: no links
            _check_own_file(Path(f"{self.path}{side}"))
        if read_only:
            self._open_read_only()
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        con = self._connect()
        try:
            con.execute("PRAGMA journal_mode=WAL")  # persistent: readers never block a writer
            with con:
                con.execute(_SCHEMA)
        except sqlite3.DatabaseError as err:  # the first statement that reads the file
            _full_disk(self.path, err)
            if isinstance(err, sqlite3.OperationalError) and "locked" in str(err):
                raise
            raise ValueError(f"{self.path} is not a usable results store ({err}): a damaged "
                             f"file or another file under that name; restore it from a copy, "
                             f"or move it aside to start a new store") from None
        finally:
            con.close()

    def _open_read_only(self) -> None:
        """Open for reading only (``mode=ro``, else ``immutable=1``), checking the table."""
        from urllib.parse import quote

        if not self.path.is_file():
            raise FileNotFoundError(errno.ENOENT, "the results store is missing: the study has "
                                    "not run yet", str(self.path))
        if self.path.stat().st_size == 0:
            raise ValueError(f"{self.path} is empty (0 bytes), not a results store: restore it "
                             f"from a copy, or move it aside and re-run the study")
        base = f"file:{quote(str(self.path.resolve()))}"
        last = None
        for mode in ("mode=ro", "immutable=1"):  # immutable: a folder nothing can be written in
            self._uri = f"{base}?{mode}"
            try:
                con = self._connect()
                try:
                    found = con.execute("SELECT name FROM sqlite_master WHERE type='table' "
                                        "AND name='runs'").fetchone()
                finally:
                    con.close()
            except (ValueError, sqlite3.OperationalError) as err:
                last = err
                continue
            except sqlite3.DatabaseError as err:
                _full_disk(self.path, err)
                raise ValueError(f"{self.path} is not a usable results store ({err}): a "
                                 f"damaged file or another file under that name; restore it "
                                 f"from a copy") from None
            if found is None:
                raise ValueError(f"{self.path} has no runs table: not a study's results store")
            return
        raise ValueError(f"cannot read the results store {self.path}: {last}")

    def _connect(self) -> sqlite3.Connection:
        try:
            con = sqlite3.connect(self._uri, timeout=self.timeout, uri=True) if self._uri else \
                sqlite3.connect(self.path, timeout=self.timeout)
        except sqlite3.Error as err:
            raise ValueError(f"cannot open the results store {self.path}: {err}") from None
        con.execute(f"PRAGMA busy_timeout = {int(self.timeout * 1000)}")
        con.row_factory = sqlite3.Row
        return con

    # ---- writing ------------------------------------------------------------------------------
    def put(self, row: dict) -> None:
        """Insert or replace one run's row (one transaction). Keys outside `COLUMNS`
        raise ``ValueError``; missing ones are NULL; ``finished_at`` defaults to now (UTC)."""
        self.put_many([row])

    def put_many(self, rows: list[dict]) -> None:
        """Insert or replace several runs' rows (as `put` each) in one transaction: one
        commit (a disk sync) for a group of runs that finished together."""
        rows = [self._values(row) for row in rows]
        if rows:
            self._write(f"INSERT OR REPLACE INTO runs ({', '.join(COLUMNS)}) "
                        f"VALUES ({', '.join('?' * len(COLUMNS))})", rows, many=True)

    def _values(self, row: dict) -> list:
        """A row's cells in `COLUMNS` order, checked (see `put`)."""
        unknown = sorted(set(row) - set(COLUMNS))
        if unknown:
            raise ValueError(f"{self.path}: unknown column(s) {unknown} in a run row; the runs "
                             f"table has {list(COLUMNS)}")
        if not row.get("run_id"):
            raise ValueError(f"{self.path}: a run row needs a run_id")
        status = row.get("status", "done")
        if status not in STATUSES:
            raise ValueError(f"{self.path}: run {row['run_id']!r} has status {status!r}; "
                             f"expected one of {STATUSES}")
        row = {"status": status, "variant": "{}",
               "finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **row}
        return [_cell(c, row.get(c)) for c in COLUMNS]

    def delete(self, run_id: str) -> bool:
        """Remove one run's row; ``True`` if there was one."""
        return self._write("DELETE FROM runs WHERE run_id = ?", [run_id]) > 0

    def _write(self, sql: str, values, many: bool = False) -> int:
        con = self._connect()
        try:
            for attempt in range(5):  # the busy timeout covers most waits; this the rest
                try:
                    with con:  # one short transaction: committed, or rolled back on error
                        if many:
                            return con.executemany(sql, values).rowcount
                        return con.execute(sql, values).rowcount
                except sqlite3.OperationalError as err:
                    _full_disk(self.path, err)
                    if "locked" not in str(err) or attempt == 4:
                        raise
                    time.sleep(0.05 * (attempt + 1))
        finally:
            con.close()
        return 0

    # ---- reading ------------------------------------------------------------------------------
    def rows(self, **where) -> list[dict]:
        """Every row (ordered by ``run_id``) whose columns equal ``where``'s values:
        ``store.rows(status="failed")``, ``store.rows(method="an", seed=0)``."""
        unknown = sorted(set(where) - set(COLUMNS))
        if unknown:
            raise ValueError(f"unknown column(s) {unknown}; the runs table has {list(COLUMNS)}")
        clause = " AND ".join(f"{c} IS ?" for c in where)
        sql = "SELECT * FROM runs" + (f" WHERE {clause}" if clause else "") + " ORDER BY run_id"
        con = self._connect()
        try:
            rows = [dict(r) for r in con.execute(sql, [_cell(c, v) for c, v in where.items()])]
        finally:
            con.close()
        for row in rows:  # a number column holding text (an edited store) is named, not dropped
            for c in _TYPES:
                if isinstance(row.get(c), (str, bytes)):
                    raise ValueError(f"{self.path}: run {row.get('run_id')!r}: {c} is "
                                     f"{row[c]!r}, not a number (the store was edited or is "
                                     f"damaged); restore it from a copy, or delete the row and "
                                     f"re-run the study")
        return rows

    def run_ids(self, status: str | None = None) -> set:
        """The run ids in the store (with that status, if given)."""
        return {r["run_id"] for r in (self.rows(status=status) if status else self.rows())}

    def counts(self) -> dict:
        """``{status: number of rows}``."""
        out: dict = {}
        for r in self.rows():
            out[r["status"]] = out.get(r["status"], 0) + 1
        return out

    def selected(self, run_ids=None) -> list[dict]:
        """`select_best` of the stored rows; ``run_ids`` (optional) restricts the
        candidates, e.g. to a spec's current runs (a study folder is read that way by
        [`spmlkit.experiments.study.open_study`][spmlkit.experiments.study.open_study])."""
        keep = None if run_ids is None else set(run_ids)
        return select_best(r for r in self.rows(status="done")
                           if keep is None or r["run_id"] in keep)

    # ---- export -------------------------------------------------------------------------------
    def export(self, path, fmt: str = "csv", selected: bool = False, *,
               force: bool = False) -> Path:
        """Write the stored rows (every row, or `selected`) to ``path`` atomically, by the
        writer rule (`spmlkit.safe_write.write_output`: an existing file only with ``force``).

        This is the store alone: it knows no spec, so after a study folder was re-run with a
        changed spec it holds the earlier spec's rows too. ``spml study export`` writes through
        `spmlkit.experiments.study.StudyFolder.export` instead (the current spec's rows,
        never over an existing file). ``fmt``: see `format_rows`. The paper-style table is
        `spmlkit.experiments.tables.study_table`.
        """
        from ..safe_write import write_output

        rows = self.selected() if selected else self.rows()
        return write_output(path, format_rows(rows, fmt), force=force)


def selection_value(row: dict, metric: str = "map"):
    """What `select_best` compares for ``metric``: the ``val_map`` column for ``"map"``,
    else ``val_metrics.<metric>`` of the row's ``metrics`` JSON (None when missing or not a
    finite number)."""
    if metric == "map":
        value = row.get("val_map")
    else:
        found = row.get("metrics")
        if isinstance(found, str):
            try:
                found = json.loads(found or "{}")
            except json.JSONDecodeError:
                found = {}
        value = ((found or {}).get("val_metrics") or {}).get(metric) \
            if isinstance(found, dict) else None
    return float(value) if _finite(value) else None


def select_best(rows, metric: str = "map") -> list[dict]:
    """The selection rule of the papers: per (method, dataset, regime, seed, variant) the
    ``done`` row with the best val ``metric`` (`selection_value`; ``val_map`` by default,
    the smallest value for a lower-is-better metric such as ``ranking_loss``), ordered by group.

    Failed rows and NaN / missing values never compete; on a tie the smaller ``run_id`` wins.

    >>> rows = [{"run_id": i, "method": "an", "dataset": "d", "regime": "1p", "seed": 0,
    ...          "variant": "{}", "status": "done", "val_map": v} for i, v in
    ...         [("b", 2.0), ("a", 2.0), ("c", None)]]
    >>> [r["run_id"] for r in select_best(rows)]
    ['a']
    """
    from ..metrics import higher_is_better

    sign = 1.0 if higher_is_better(metric) else -1.0
    best: dict = {}
    values: dict = {}
    for r in sorted(rows, key=lambda r: r["run_id"]):
        value = selection_value(r, metric) if r.get("status") == "done" else None
        if value is None:
            continue
        key = tuple(r.get(c) for c in GROUP)
        if key not in best or sign * value > sign * values[key]:
            best[key], values[key] = r, value
    return sorted(best.values(), key=_group_key)


def _num(value, column: str = "") -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:g}" if column == "lr" else f"{value:.2f}"
    return str(value)


_LATEX = {"&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_", "{": r"\{", "}": r"\}",
          "~": r"\textasciitilde{}", "^": r"\textasciicircum{}", "\\": r"\textbackslash{}"}


def latex_escape(text) -> str:
    """``text`` with LaTeX's special characters escaped (``a_b & c`` -> ``a\\_b \\& c``)."""
    return "".join(_LATEX.get(ch, ch) for ch in str(text))


def _inert(value):
    """A text cell a spreadsheet would run as a formula (``=HYPERLINK(...)`` in a method label
    of a study someone sent) behind a ``'``, as spreadsheets themselves mark text; numbers and
    other text as they are."""
    if isinstance(value, str) and value[:1] in ("=", "+", "-", "@", "\t", "\r"):
        return "'" + value
    return value


def format_rows(rows, fmt: str) -> str:
    """Run rows as text: ``csv`` (every column), ``json`` (a list of objects; ``variant``,
    ``metrics`` and ``config`` parsed), ``markdown`` / ``md`` or ``latex`` (the columns of
    `BRIEF_COLUMNS`)."""
    fmt = {"md": "markdown"}.get(fmt, fmt)
    if fmt not in EXPORT_FORMATS:
        raise ValueError(f"unknown export format {fmt!r}; choose one of "
                         f"{', '.join(EXPORT_FORMATS)} (or md)")
    rows = [dict(r) for r in rows]
    if fmt == "json":
        for r in rows:
            for c in JSON_COLUMNS:
                if isinstance(r.get(c), str):
                    try:
                        r[c] = json.loads(r[c])
                    except json.JSONDecodeError:
                        pass
        return json.dumps(rows, indent=2) + "\n"
    if fmt == "csv":
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=list(COLUMNS), lineterminator="\n",
                                extrasaction="ignore")
        writer.writeheader()
        writer.writerows({k: _inert(v) for k, v in r.items()} for r in rows)
        return buf.getvalue()
    cells = [[_num(r.get(c), c) for c in BRIEF_COLUMNS] for r in rows]
    if fmt == "markdown":
        lines = ["| " + " | ".join(BRIEF_COLUMNS) + " |", "|" + "---|" * len(BRIEF_COLUMNS)]
        lines += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in cells]
        return "\n".join(lines) + "\n"
    lines = [r"\begin{tabular}{" + "l" * len(BRIEF_COLUMNS) + "}", r"\toprule",
             " & ".join(latex_escape(c) for c in BRIEF_COLUMNS) + r" \\", r"\midrule"]
    lines += [" & ".join(latex_escape(c) for c in row) + r" \\" for row in cells]
    lines += [r"\bottomrule", r"\end{tabular}"]
    return "\n".join(lines) + "\n"
