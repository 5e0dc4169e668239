"""SPMLClassifier.fit on yeast (AN, 25 epochs): n_threads=1 (the default, as ``spml``) against
torch's own thread count (n_threads=None: all cores). Run it while something else loads the
CPU to see the contention, e.g.:

    timeout 110 python -c 'while True: pass' &
    PYTHONPATH=src python benchmarks/estimator_threads.py
"""
import time

import torch

from spmlkit import SPMLClassifier
from spmlkit.loading import load_splits

s = load_splits("yeast")
print("torch default threads:", torch.get_num_threads(), flush=True)
res = {}
for n in (1, None) * 3:
    clf = SPMLClassifier(solver="adam", loss="an", epochs=25, lr=1e-3, n_threads=n)
    t0 = time.perf_counter()
    clf.fit(s.train.x, s.observed)
    dt = time.perf_counter() - t0
    res.setdefault(n, []).append(dt)
    print(f"n_threads={n}: {dt:.2f} s", flush=True)
print({str(k): round(min(v), 2) for k, v in res.items()}, "ratio default/1 =",
      round(min(res[None]) / min(res[1]), 1))
