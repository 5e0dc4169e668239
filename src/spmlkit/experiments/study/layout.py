"""Where a study lives: the default root of study folders and the names inside one."""
from __future__ import annotations

from pathlib import Path

#: the study folders' default root: ``runs/studies/<name>``
STUDIES_ROOT = Path("runs") / "studies"
#: the shipped presets (``spml study list``), looked up by name
PRESETS_DIR = Path(__file__).resolve().parent.parent / "presets"
SPEC_FILE = "study.yaml"
RESULTS_FILE = "results.sqlite"
LAUNCHES_FILE = "launches.jsonl"
RUNS_DIR = "runs"
