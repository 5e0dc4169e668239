"""What the benchmark scripts share: writing their rows."""
from __future__ import annotations

import csv
from pathlib import Path


def write_rows(out, rows: list[dict]) -> None:
    """``rows`` (dicts with the same keys, in the first row's order) as the CSV ``out``, its
    folder made if missing."""
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
