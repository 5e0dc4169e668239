"""The CPU of ``make demo`` (``spml benchmark`` on yeast with every default) against the release
before the scikit-learn reference rows (issue 44: "its CPU at or below the previous release's").

Each repeat runs, one after the other in a fresh output folder:

- ``before``: the same command at ``--ref`` (default 0653fa3, the last commit without the
  reference rows), from that commit's files (``OUT/before-src``, by ``git archive``) with
  this interpreter and its packages;
- ``now``: the command of this checkout;

and measures the CPU seconds of each command's whole process tree (the main process, the fork
server, the workers): with a cgroup-v1 ``cpuacct`` group where one can be made (root), else the
machine's busy CPU time from ``/proc/stat`` over the command (then other work on the machine
counts too: run it on a quiet machine). Each command runs once first, unmeasured, and with
Python's bytecode cache on (``PYTHONDONTWRITEBYTECODE`` removed from their environment): both
are measured as a user's ``make demo`` runs after its first, not compiling their sources. The
reference rows' own seconds are read from the ``now`` folder's ``sklearn-reference.json``
(each row's fits; the import of scikit-learn and the splits are not in them).

    python benchmarks/demo_cpu.py --out runs/demo-cpu --repeats 3

Writes ``OUT/demo-cpu.csv`` (one row per command and repeat) and prints the medians.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
CGROUP = Path("/sys/fs/cgroup/cpuacct")


def _busy_seconds() -> float:
    with open("/proc/stat") as f:
        fields = [int(v) for v in f.readline().split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields[:8]
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def measure(cmd: list, env: dict, cwd: Path, log: Path) -> tuple[float, float, str]:
    """``(CPU seconds, wall seconds, method)`` of ``cmd``'s process tree."""
    group = CGROUP / f"spmlkit-demo-cpu-{os.getpid()}"
    try:
        group.mkdir(exist_ok=True)
        (group / "cpuacct.usage").write_text("0")
        method = "cgroup cpuacct"
    except OSError:
        group, method = None, "/proc/stat busy time (the whole machine)"
    # the child joins the group before it execs the command
    pre = None if group is None else (lambda: (group / "cgroup.procs").write_text(
        str(os.getpid())))
    busy, start = _busy_seconds(), time.perf_counter()
    with open(log, "w") as out:
        rc = subprocess.run(cmd, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
                            preexec_fn=pre).returncode
    wall = time.perf_counter() - start
    if rc != 0:
        raise SystemExit(f"{' '.join(cmd)} failed (exit status {rc}): see {log}")
    if group is None:
        return _busy_seconds() - busy, wall, method
    for _ in range(100):  # the fork server and workers end just after the command
        if not (group / "cgroup.procs").read_text().strip():
            break
        time.sleep(0.1)
    cpu = int((group / "cpuacct.usage").read_text()) / 1e9
    try:
        group.rmdir()
    except OSError:  # a straggler still in it: left for the system
        pass
    return cpu, wall, method


def checkout(ref: str, where: Path) -> Path:
    """The files of ``ref`` in ``where`` (``git archive``: the repository is left as it is);
    their ``src`` folder."""
    if not (where / "src" / "spmlkit").is_dir():
        where.mkdir(parents=True, exist_ok=True)
        tar = subprocess.run(["git", "archive", ref], cwd=ROOT, check=True,
                             capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(where)], input=tar, check=True)
    return where / "src"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="runs/demo-cpu")
    p.add_argument("--ref", default="0653fa3", help="the release to compare with")
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    before_src = checkout(args.ref, out / "before-src")
    commands = {"before": (before_src, out / "before-src"), "now": (ROOT / "src", ROOT)}
    rows = []
    base = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    for repeat in range(-1, args.repeats):  # -1: the unmeasured first run of each
        for name, (src, cwd) in commands.items():
            folder = out / f"{name}-run"
            shutil.rmtree(folder, ignore_errors=True)
            env = {**base, "PYTHONPATH": str(src)}
            cpu, wall, method = measure(
                [sys.executable, "-m", "spmlkit.cli", "benchmark", "--out", str(folder)],
                env, cwd, out / f"{name}.log")
            if repeat < 0:
                print(f"{name}: first run (not measured) {cpu:.2f} s of CPU", flush=True)
                continue
            refs = folder / "sklearn-reference.json"
            fits = None
            if refs.is_file():  # one fit per regime (the seeds share it)
                seen = {r["loss"]: r["seconds"] for r in json.loads(refs.read_text())}
                fits = round(sum(seen.values()), 2)
            rows.append({"command": name, "repeat": repeat, "cpu_s": round(cpu, 2),
                         "wall_s": round(wall, 2), "reference_fits_s": fits,
                         "method": method})
            print(f"{name} (repeat {repeat}): {cpu:.2f} s of CPU, {wall:.2f} s wall"
                  + (f", the reference rows' fits {fits:.2f} s" if fits else ""), flush=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, cwd=ROOT).stdout.strip()
    with open(out / "demo-cpu.csv", "w", newline="") as f:
        f.write(f"# python benchmarks/demo_cpu.py {' '.join(argv or sys.argv[1:])}\n"
                f"# {platform.machine()}, {os.cpu_count()} cores; spmlkit at {commit}, "
                f"before = {args.ref}; Python {platform.python_version()}\n")
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    for name in commands:
        cpu = [r["cpu_s"] for r in rows if r["command"] == name]
        wall = [r["wall_s"] for r in rows if r["command"] == name]
        print(f"{name}: median {statistics.median(cpu):.2f} s of CPU ({min(cpu):.2f} - "
              f"{max(cpu):.2f}), median {statistics.median(wall):.2f} s wall")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
