"""``spml benchmark --solver lbfgs``: every loss solved along the C path, the user's alternative
as the first candidate, in seconds (the default on your own data).

Per seed (a draw of the observed labels, and of the split under the tabular protocol) and per
loss, `spmlkit.engine.solve.solve_path` solves the head for each C of the path, strong to weak,
warm-started, and keeps the C with the best val mAP. AN solved there is the scikit-learn
one-vs-rest logistic regression at the same C (``tests/test_solve.py``); every other loss is a
step beyond it.

The first candidate is what a user would run instead: the scikit-learn row itself
(``LogisticRegression`` fitted by scikit-learn, C tuned on val over the same path), or AN when
the reference is left out (``sklearn=False``). The two agree at every C to the solver's
tolerance, but where val is flat (a few dozen val rows) a C far along the path can win val by a
hair in one and not the other (flags: the two picked 10^4 and 10^-4 on one draw); the baseline
is the model the user would otherwise have, exactly.

Which row a seed takes (`pick_on_val`): the loss with the best val mAP, when its gain over the
baseline is significant; else the baseline. Significant: the gain exceeds ``z`` standard
errors of the paired difference (a bootstrap over the val rows), ``z`` the one-sided normal
quantile of 5 % shared among the K candidates beside AN (Bonferroni: the best of K is the
largest of K noisy gains, so one standard error, glmnet's ``lambda.1se`` rule, picked a lucky
loss on emotions' 83 val rows: -0.65 on test). A loss replaces the logistic regression only
when val says so clearly. ``pick="best"`` takes the best val mAP as it is.

The folder: ``solves.jsonl`` (one record per loss x seed, written as each finishes; a re-launch
with the same settings skips those done), ``predictions/<loss>-s<seed>.npz`` (val and test
probabilities at the selected C, float32; the train ones with ``train_predictions=True``),
``results.json`` and ``table.md``; the scikit-learn reference rows (fitted by scikit-learn on the
same rows, C on the same grid) in ``sklearn-reference.json``.
"""
from __future__ import annotations

import hashlib
import json
import sys
import time
from pathlib import Path

import numpy as np

from ..engine.solve import C_PATH, PATIENCE, ROUNDS, TOL, solve_path, solver_form

#: the losses solved by default: the smooth ones docs/choosing.md discusses (PR is refused by
#: the solver: its hinge; train it with --solver adam)
DEFAULT_SOLVER_LOSSES = ("an", "zlpr", "focal", "wan", "ll_r", "hill", "role", "epr")
#: the baseline a loss must beat on val (AN solved = the tuned logistic regression)
BASELINE = "an"
#: bootstrap draws of the val rows behind the standard error of `pick_on_val`
BOOTSTRAP = 200
#: the observed-label draw of seed s is OFFICIAL_DRAW + s (seed 0: the official draw)
OFFICIAL_DRAW = 1200
SOLVES_FILE = "solves.jsonl"


def _score(probs, y) -> float:
    from ..metrics import map_score

    return float(map_score(probs, y))


#: the one-sided level of `pick_on_val`'s test, shared among the candidates beside AN
LEVEL = 0.05
PICK_RULES = ("significant", "best")


def pick_on_val(val_probs: dict, y_val, baseline: str = BASELINE, rule: str = "significant",
                draws: int = BOOTSTRAP, seed: int = 0) -> tuple[str, dict]:
    """The loss a row takes from ``val_probs`` (loss -> val probabilities at its selected C):
    ``(name, why)`` with ``why`` holding the val mAPs, the gain of the best over ``baseline``
    (the scikit-learn row, or AN),
    its standard error and the ``z`` it had to exceed. ``rule="significant"`` (module
    docstring), or ``"best"``.

    >>> y = np.array([[1, 0], [0, 1], [1, 1], [0, 0]] * 5)
    >>> good, bad = y + 0.1, 1.0 - y
    >>> pick_on_val({"an": bad, "epr": good}, y)[0], pick_on_val({"an": good, "epr": good}, y)[0]
    ('epr', 'an')
    """
    if rule not in PICK_RULES:
        raise ValueError(f"rule must be one of {PICK_RULES}, got {rule!r}")
    scores = {name: _score(p, y_val) for name, p in val_probs.items()}
    best = max(scores, key=lambda name: (scores[name], name == baseline))
    why = {"val_map": scores, "best": best, "gain": None, "se": None, "z": None}
    if rule == "best" or baseline not in scores or best == baseline:
        return best, why
    rng = np.random.default_rng(seed)
    n = len(y_val)
    diffs = []
    for _ in range(draws):
        rows = rng.integers(0, n, n)
        diffs.append(_score(val_probs[best][rows], y_val[rows])
                     - _score(val_probs[baseline][rows], y_val[rows]))
    from scipy.stats import norm

    gain = scores[best] - scores[baseline]
    se = float(np.nanstd(diffs, ddof=1))
    z = float(norm.ppf(1.0 - LEVEL / max(1, len(scores) - 1)))
    why.update(gain=gain, se=se, z=z)
    return (best if gain > z * se else baseline), why


def _key(settings: dict) -> str:
    return hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()
                          ).hexdigest()[:16]


def _done(out: Path) -> dict:
    path = out / SOLVES_FILE
    found = {}
    if path.is_file():
        for line in path.read_text().splitlines():
            try:
                rec = json.loads(line)
                found[rec["key"]] = rec
            except (json.JSONDecodeError, KeyError, TypeError):
                continue  # a line cut by an interruption: that solve runs again
    return found


def load_seed_splits(dataset: str, options: dict, regime: str, seed: int):
    """A seed's splits: the observed labels drawn with ``OFFICIAL_DRAW + seed`` (regimes that
    draw; ``given`` keeps the user's), the tabular protocol's split with ``seed``."""
    from ..data import trial_options
    from ..loading import load_splits

    return load_splits(dataset, regime, None if regime == "given" else OFFICIAL_DRAW + seed,
                       **trial_options(options, seed))


def run_solver_benchmark(dataset: str, losses=DEFAULT_SOLVER_LOSSES, seeds: int = 3,
                         out="runs/benchmark", *, c=C_PATH, dataset_options: dict | None = None,
                         regime: str | None = None, hparams: dict | None = None,
                         rounds: int = ROUNDS, tol: float = TOL, patience: int = PATIENCE,
                         pick: str = "significant", sklearn: bool = True, progress: bool = True,
                         train_predictions: bool = False, argv=None) -> dict:
    """Solve every loss of ``losses`` on ``seeds`` draws along the path ``c``; pick per seed
    (`pick_on_val`); write the folder (module docstring) and return ``{"records", "picked",
    "sklearn", "table", "seconds", "cpu_seconds"}``.

    Raises:
        ValueError: a loss the solver refuses (naming why, before anything is solved), an
            unknown loss, bad seeds.
    """
    from ..engine import torch_threads
    from ..losses import create_loss
    from ..methods.contract import resolve_hparams
    from ..safe_write import write_json, write_text
    from .benchmark import observed_labels
    from .study import parse_methods

    if isinstance(seeds, bool) or not isinstance(seeds, int) or seeds < 1:
        raise ValueError(f"seeds must be a whole number >= 1, got {seeds!r}")
    options = dict(dataset_options or {})
    regime = regime or ("given" if observed_labels(options) else "1p")
    methods = parse_methods(losses, [], regime)
    other = [m.label for m in methods if m.regime != regime]
    if other:
        raise ValueError(f"--losses {', '.join(other)}: every loss of a solver benchmark trains "
                         f"on the benchmark's regime ({regime}); give --regime instead")
    hparams = dict(hparams or {})

    def make(m):
        hp = resolve_hparams(m.loss, dataset, {**hparams.get(m.loss, {}),
                                               **hparams.get(m.label, {})})
        return hp, create_loss(m.loss, reg=list(m.reg) or None, **hp)

    for m in methods:  # refused losses named before any solve
        form, why = solver_form(make(m)[1])
        if form == "refused":
            raise ValueError(f"--losses {m.label.split('@')[0]}: the solver cannot minimise "
                             f"it ({why})")
    names = [m.label.split("@")[0] for m in methods]
    if regime == "given" and options.get("protocol") != "tabular" and seeds > 1:
        # your own observed labels are one draw: every seed would solve the same problem
        print(f"note: --seeds {seeds}: the training labels are your own (regime given), one "
              f"draw, and the solves are deterministic: seed 0 only (the tabular protocol, "
              f"--data protocol=tabular, splits the rows anew per seed)", file=sys.stderr)
        seeds = 1
    out = Path(out)
    (out / "predictions").mkdir(parents=True, exist_ok=True)
    done = _done(out)
    start, cpu0 = time.perf_counter(), time.process_time()
    cs = sorted(float(v) for v in np.atleast_1d(c))
    # the bar counts solves (each C of each loss x seed) and the reference's fits (each C of
    # each seed), so its rate and ETA come from the first seconds
    bar = _Bar((len(names) + (1 if sklearn else 0)) * seeds * len(cs), progress)
    records, picked, refs = [], [], []
    val_keep: dict = {}
    with torch_threads(1), open(out / SOLVES_FILE, "a") as log:
        for seed in range(seeds):
            splits = load_seed_splits(dataset, options, regime, seed)
            val_keep.clear()
            if sklearn:  # the baseline candidate: the user's own alternative, as they fit it
                bar.describe(f"sklearn_lr seed {seed}")
                ref = _sklearn_row(splits, seed, cs, on_fit=lambda c: bar.step())
                bar.skip(len(cs) - ref["fits"])  # its path stopped early
                refs.append({key: v for key, v in ref.items() if key != "probs"})
                val_keep[ref["loss"]] = ref["probs"]["val"]
            for name, method in zip(names, methods):
                hp, loss = make(method)
                settings = {"dataset": dataset, "options": options, "regime": regime,
                            "loss": name, "hparams": hp, "reg": list(method.reg),
                            "seed": seed, "c": cs, "rounds": rounds, "tol": tol,
                            "patience": patience}
                key = _key(settings)
                pred_file = out / "predictions" / f"{name}-s{seed}.npz"
                if key in done and pred_file.is_file():
                    rec = done[key]
                    with np.load(pred_file) as f:
                        val_keep[name] = f["val"]
                    bar.skip(len(cs))
                    records.append(rec)
                    continue
                bar.describe(f"{name} seed {seed}")
                rec, kept = _solved(splits, loss, name, seed, regime, cs, bar, rounds=rounds,
                                    tol=tol, patience=patience,
                                    train_predictions=train_predictions)
                rec = {"key": key, **rec}
                np.savez(pred_file, **kept)
                log.write(json.dumps(rec) + "\n")
                log.flush()
                val_keep[name] = kept["val"]
                records.append(rec)
            baseline = refs[-1]["loss"] if sklearn else BASELINE
            name, why = pick_on_val(dict(val_keep), splits.val.y, baseline=baseline,
                                    rule=pick, seed=seed)
            rec = next(r for r in records + refs if r["loss"] == name and r["seed"] == seed)
            picked.append({**{k2: rec[k2] for k2 in ("loss", "seed", "C", "val_map",
                                                      "test_map", "train_recovery_map")},
                           "rule": pick, "baseline": baseline, "best_on_val": why["best"],
                           "gain": why["gain"], "se": why["se"], "z": why["z"]})
    bar.close()
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu0
    table = format_solver_table(records, picked, refs, dataset, seeds, cs, pick, seconds, cpu)
    write_json(out / "results.json", {"records": records, "picked": picked, "sklearn": refs,
                                      "argv": list(argv or []), "seconds": seconds,
                                      "cpu_seconds": cpu})
    if refs:
        from .reference import SKLEARN_FILE

        write_json(out / SKLEARN_FILE, refs)
    write_text(out / "table.md", table)
    return {"records": records, "picked": picked, "sklearn": refs, "table": table,
            "seconds": seconds, "cpu_seconds": cpu}


def _solved(splits, loss, name: str, seed: int, regime: str, cs: list, bar, *, rounds, tol,
            patience, train_predictions: bool) -> tuple[dict, dict]:
    """One loss's path on one seed's splits (`solve_path`, a step of ``bar`` per solve): its
    row of ``results.json`` (without its key) and the probabilities kept (val, test, and train
    with ``train_predictions``)."""
    import torch

    t0, c0 = time.perf_counter(), time.process_time()
    solved = [0]

    def on_solve(record):
        solved[0] += 1
        bar.step()

    model, path = solve_path(splits.train.x, splits.observed,
                             loss, x_val=splits.val.x,
                             y_val=splits.val.y, c=cs, k=float(splits.k), seed=seed,
                             rounds=rounds, tol=tol, patience=patience,
                             on_solve=on_solve)
    bar.skip(len(cs) - solved[0])  # the path stopped early
    with torch.no_grad():
        probs = {part: torch.sigmoid(model(torch.as_tensor(
            np.asarray(getattr(splits, part).x, np.float32)))).numpy()
            for part in (("train", "val", "test") if train_predictions or
                         splits.train_labels_complete else ("val", "test"))}
    rec = {"loss": name, "seed": seed, "regime": regime,
           "C": path.c, "form": path.form,
           "val_map": path.records[path.best].val_score,
           "test_map": _score(probs["test"], splits.test.y),
           "train_recovery_map": _score(probs["train"], splits.train.y)
           if splits.train_labels_complete else None,
           "solves": len(path.records),
           "iterations": sum(r.iterations for r in path.records),
           "converged": all(r.converged for r in path.records),
           "seconds": time.perf_counter() - t0,
           "cpu_seconds": time.process_time() - c0,
           "path": [{"C": r.c, "val_map": r.val_score, "iterations": r.iterations,
                     "converged": r.converged} for r in path.records]}
    kept = {"val": probs["val"], "test": probs["test"]}
    if train_predictions:
        kept["train"] = probs["train"]
    return rec, kept


def _sklearn_row(splits, seed: int, cs, on_fit=None) -> dict:
    import sklearn.linear_model  # noqa: F401 (its import is not the fits' CPU)

    from .reference import NAME, sklearn_reference

    c0 = time.process_time()
    res = sklearn_reference(splits, seed, grid=tuple(cs), keep_probs=True, on_fit=on_fit)
    return {"loss": NAME, "seed": seed, "C": res["C"], "val_map": res["val_map"],
            "test_map": res["test_map"], "train_recovery_map": res["train_recovery_map"],
            "seconds": res["seconds"], "cpu_seconds": time.process_time() - c0,
            "fits": len(res["val_maps"]), "reference": "scikit-learn", "probs": res["probs"]}


class _Bar:
    """A tqdm bar over the path's solves (each C of each loss x seed) and the scikit-learn
    row's fits (each C), with its ETA from the first one; a path that stops early takes its
    unsolved values off the count."""

    def __init__(self, total: int, enabled: bool):
        self.bar = None
        if enabled:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total, unit="solve", file=sys.stderr, dynamic_ncols=True,
                            smoothing=0.05)

    def describe(self, text: str) -> None:
        if self.bar is not None:
            self.bar.set_description(text, refresh=False)

    def step(self) -> None:
        if self.bar is not None:
            self.bar.update(1)

    def skip(self, n: int) -> None:
        if self.bar is not None and n:
            self.bar.total -= n
            self.bar.refresh()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _mean_std(values) -> str:
    v = np.asarray([np.nan if x is None else x for x in values], dtype=float)
    if v.size == 0 or np.isnan(v).all():
        return "n/a"
    return f"{np.nanmean(v):.2f} ± {np.nanstd(v, ddof=1):.2f}" if v.size > 1 else \
        f"{v[0]:.2f}"


def format_solver_table(records, picked, refs, dataset, seeds, cs, rule, seconds, cpu) -> str:
    """Markdown: per loss its test / val mAP (mean ± std over the seeds) at the C selected on
    val; the picked row (`pick_on_val`); the scikit-learn row and the gap."""
    from .tables import markdown_grid

    lines = [f"Test mAP on `{dataset}` (mean ± std over {seeds} draw(s) of the observed "
             f"labels); each loss solved along C = {cs[0]:g} .. {cs[-1]:g} ({len(cs)} values, "
             f"warm-started, the C with the best val mAP kept).", ""]
    body = []
    for name in dict.fromkeys(r["loss"] for r in records):
        rows = [r for r in records if r["loss"] == name]
        body.append([name, rows[0]["form"], _mean_std([r["test_map"] for r in rows]),
                     _mean_std([r["val_map"] for r in rows]),
                     _mean_std([r["train_recovery_map"] for r in rows]),
                     ", ".join(f"{c:g}" for c in sorted({r["C"] for r in rows})),
                     f"{sum(r['cpu_seconds'] for r in rows):.1f}"])
    if picked:
        names = ", ".join(f"{p['loss']}" for p in picked)
        body.append([f"**picked on val** ({rule})", names,
                     _mean_std([p["test_map"] for p in picked]),
                     _mean_std([p["val_map"] for p in picked]),
                     _mean_std([p["train_recovery_map"] for p in picked]),
                     ", ".join(f"{p['C']:g}" for p in picked), ""])
    if refs:
        body.append(["*sklearn_lr* (reference, scikit-learn)", "unknown = negative",
                     _mean_std([r["test_map"] for r in refs]),
                     _mean_std([r["val_map"] for r in refs]),
                     _mean_std([r["train_recovery_map"] for r in refs]),
                     ", ".join(f"{c:g}" for c in sorted({r["C"] for r in refs})),
                     f"{sum(r['cpu_seconds'] for r in refs):.1f}"])
    lines += markdown_grid(["method", "solved as", "test mAP", "val mAP", "train recovery mAP",
                            "selected C", "CPU s"], body)
    if picked and refs:
        gap = float(np.mean([p["test_map"] for p in picked]) -
                    np.mean([r["test_map"] for r in refs]))
        lines += ["", f"Picked on val minus scikit-learn (test mAP): {gap:+.2f}."]
    lines += ["", f"Wall time {seconds:.1f} s, CPU {cpu:.1f} s (this launch)."]
    return "\n".join(lines) + "\n"

