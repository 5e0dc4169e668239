"""Where a study lives: the default root of study folders and the names inside one."""
from __future__ import annotations

import errno
import os
from pathlib import Path

#: the study folders' default root: ``runs/studies/<name>``
STUDIES_ROOT = Path("runs") / "studies"
#: the shipped presets (``spml study list``), looked up by name
PRESETS_DIR = Path(__file__).resolve().parent.parent / "presets"
SPEC_FILE = "study.yaml"
RESULTS_FILE = "results.sqlite"
LAUNCHES_FILE = "launches.jsonl"
RUNS_DIR = "runs"

#: what marks a folder as a study folder (a benchmark's from an older spmlkit: ``grid.jsonl``);
#: not ``study.yaml``, which a user's own spec is called too (it would be replaced)
STUDY_MARKERS = (RESULTS_FILE, LAUNCHES_FILE, "grid.jsonl")


def check_study_folder(out) -> None:
    """A launch writes into a new folder, an empty one or a study folder (`STUDY_MARKERS`);
    a folder of other files is refused (an ``OSError`` naming it): the launch would replace
    files of the names it writes (``study.yaml``, ``table.md``, ``results.json``, ...).
    Hidden names (an interrupted launch's ``.lock``, ``.DS_Store``) do not count."""
    out = Path(out)
    if not out.is_dir():
        return
    names = [n for n in os.listdir(out) if not n.startswith(".")]
    if names and not any(n in STUDY_MARKERS for n in names):
        shown = ", ".join(sorted(names)[:3]) + (", ..." if len(names) > 3 else "")
        raise FileExistsError(errno.EEXIST, f"holds files ({shown}) and is not a study folder "
                              f"(no {RESULTS_FILE} or {LAUNCHES_FILE}): a study writes its "
                              f"spec ({SPEC_FILE}), tables and runs there and would replace "
                              f"files of the same names; give a new or an empty folder",
                              str(out))
