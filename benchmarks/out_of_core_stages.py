"""Where a run's anonymous memory goes: one case of ``benchmarks/out_of_core.py`` in this process,
with a thread that reads ``RssAnon`` every 10 ms and records the main thread's stack (its
spmlkit frames) at every new peak, plus a timeline every 0.5 s.

    python benchmarks/out_of_core_stages.py --case single --root runs/out-of-core-200000 \\
        --epochs 1 --result r.json --out stages.json

(the store must exist: build it with ``benchmarks/out_of_core.py --rows N --cases ''``). Prints
the peak and the stack at each rise of 16 MiB or more; ``--out`` gets every record as JSON
(``peaks``: seconds, MiB, stack; ``timeline``: seconds, MiB, innermost frame). The other
arguments are the child's of ``out_of_core.py`` (``--case``, ``--root``, ``--epochs``,
``--threads``, ``--batches``, ``--result``).
"""
from __future__ import annotations

import json
import sys
import threading
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import out_of_core  # noqa: E402


def rss_anon_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) / 1024
    return 0.0


def frames(frame) -> list[str]:
    return [f"{Path(f.filename).name}:{f.lineno}:{f.name}" for f in traceback.extract_stack(frame)
            if "spmlkit" in f.filename or "out_of_core" in f.filename]


def main() -> None:
    argv = sys.argv[1:]
    out = None
    if "--out" in argv:
        i = argv.index("--out")
        out = argv[i + 1]
        del argv[i:i + 2]
    main_id = threading.get_ident()
    peaks, timeline, stop = [], [], threading.Event()

    def sample():
        peak, last, t0 = 0.0, 0.0, time.perf_counter()
        while not stop.is_set():
            mib, t = rss_anon_mib(), time.perf_counter() - t0
            if mib > peak + 2 or t - last > 0.5:
                frame = sys._current_frames().get(main_id)
                stack = frames(frame) if frame is not None else []
                if mib > peak + 2:
                    peak = mib
                    peaks.append((round(t, 2), round(mib, 1), stack))
                if t - last > 0.5:
                    last = t
                    timeline.append((round(t, 1), round(mib, 1), stack[-1] if stack else "-"))
            time.sleep(0.01)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    sys.argv = [sys.argv[0], "--child", *argv]
    try:
        out_of_core.main()
    finally:
        stop.set()
        thread.join()
        shown = 0.0
        for t, mib, stack in peaks:
            if mib >= shown + 16:
                shown = mib
                print(f"{t:8.2f} s {mib:8.1f} MiB  {' > '.join(stack[-4:])}")
        print(f"peak RssAnon {max((p[1] for p in peaks), default=0):.1f} MiB")
        if out:
            Path(out).write_text(json.dumps({"peaks": peaks, "timeline": timeline}))


if __name__ == "__main__":
    main()
