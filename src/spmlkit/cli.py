"""The ``spml`` command line: parses, resolves the configuration, calls the API."""
from __future__ import annotations

import argparse
import contextlib
import json
import sys

import numpy as np


def _value(text: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _pairs(items, what: str) -> dict:
    """``key=value`` options (``--data``, ``--hp``, ``--lac``) as a dict; a value is read as
    JSON when it parses as JSON (``0.5``, ``true``, ``[1, 2]``), else kept as text."""
    out = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"{what} {item!r}: expected key=value, e.g. {what} "
                             f"{'root=/data/pascal' if what == '--data' else 'lam=2'}")
        out[key.strip().replace("-", "_")] = _value(value)
    return out


def _data(args) -> dict:
    """The ``--data`` options; the regime has its own flag (``--regime``)."""
    options = _pairs(args.data, "--data")
    if "regime" in options:
        raise ValueError(f"--data regime={options['regime']}: the label regime is not a "
                         f"dataset option; use --regime")
    return options


def _dataset(args) -> str:
    """``--dataset``: yeast when neither it nor ``--data`` is given; options for a source need
    the source named (else they would silently go to yeast, which takes none of them)."""
    from .data import PROTOCOL_OPTIONS, check_source_options

    if args.dataset is not None:
        return args.dataset
    options = _pairs(args.data, "--data")
    try:
        check_source_options("yeast", options, PROTOCOL_OPTIONS, complete=False)
    except ValueError as err:  # e.g. labels=...: not yeast's, so meant for another source
        raise ValueError(f"{err} (no --dataset given, so the default yeast; --dataset names "
                         f"your source, e.g. --dataset tabular)") from None
    own = [item for item in args.data or []
           if item.partition("=")[0].strip().replace("-", "_") not in PROTOCOL_OPTIONS]
    if own:  # yeast's own path / seed: more likely your file (protocol options suit yeast)
        raise ValueError(f"--data {own[0]}: say which source the options are for with "
                         f"--dataset (e.g. --dataset tabular for a CSV / Parquet table, "
                         f"--dataset arrays for .npy files; spml list datasets); without "
                         f"--dataset the run is on the built-in yeast set")
    return "yeast"


def _describe_features(meta: dict, standardized: bool, out=None) -> None:
    """For a table source: which columns are the features, and whether they are standardised
    (a column that should not be a feature is seen before any run)."""
    cols = (meta or {}).get("feature_columns")
    if not cols:
        return
    from .data.arrays import _preview

    how = "standardised with the train rows' mean and std (--data standardize=false keeps " \
          "them as they are)" if standardized else "not standardised (standardize=false)"
    print(f"features: {len(cols)} column(s) of {meta.get('path')}: {_preview(cols, 12)}; {how}",
          file=out or sys.stderr)


def _floats(text: str) -> list:
    try:
        return [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated numbers, got {text!r}") from None


def _ints(text: str) -> list:
    return [int(v) for v in _floats(text)]


def _whole(low: int, high: int | None = None):
    """An argparse type: a whole number >= ``low`` (and <= ``high``)."""
    want = f"a whole number >= {low}" + (f" and <= {high}" if high is not None else "")

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {want}, got {text!r}") from None
        if value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"expected {want}, got {value}")
        return value
    return parse


def _positive(text: str) -> float:
    """An argparse type: a finite number > 0 (learning rates, k, multipliers)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}") from None
    if not np.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"expected a finite number > 0, got {text!r}")
    return value


def _device(text: str) -> str:
    """An argparse type: a torch device this machine has (``cpu``, ``cuda``, ``cuda:1``)."""
    import torch

    try:
        dev = torch.device(text)
    except (RuntimeError, ValueError):
        raise argparse.ArgumentTypeError(f"expected a device such as cpu, cuda or cuda:1, got "
                                         f"{text!r}") from None
    if dev.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if not count or (dev.index is not None and dev.index >= count):
            raise argparse.ArgumentTypeError(f"{text!r}: this machine has {count} CUDA "
                                             f"device(s)")
    return text


SEED = _whole(0, 2**32 - 1)  # numpy's RandomState takes seeds in [0, 2**32)


def _metric(text: str) -> str:
    """An argparse type: a name of :data:`spmlkit.metrics.METRICS`."""
    from .metrics import check_metric

    try:
        return check_metric(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dataset", default=None,
                   help="registered dataset (spml list datasets); default yeast, and required "
                        "with a source's --data options (e.g. --dataset tabular for your own "
                        "CSV / Parquet table)")
    p.add_argument("--data", action="append", metavar="KEY=VALUE",
                   help="dataset option, e.g. --data root=/data/pascal (repeatable)")
    p.add_argument("--epochs", type=_whole(1), default=None,
                   help="default 25 (spml train: the method's, e.g. 40 for --mode lac)")
    p.add_argument("--early-stop", default="none",
                   help="none | patience:N | drop:X (default none: fixed epochs, Cole et al.)")
    p.add_argument("--metric", default="map", type=_metric,
                   help="the val metric the best epoch (and grid point) is selected on: map "
                        "(default), lrap, micro_f1, macro_f1 (higher is better) or "
                        "ranking_loss, coverage, coverage_norm, one_error, hamming_loss "
                        "(lower is better)")
    p.add_argument("--threads", type=_whole(1), default=1,
                   help="torch threads per process (default 1: a linear head on small batches "
                        "is bound by per-operation overhead, extra threads only add contention)")


def _add_backbone(p: argparse.ArgumentParser, default: str | None = None) -> None:
    p.add_argument("--backbone", default=default,
                   help="image sources: train on this backbone's cached features, extracted "
                        "first if missing (spml list backbones)" if default is None else
                        "backbone (spml list backbones; timm:<model> with timm installed)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--float32", dest="feature_dtype", action="store_const", const="float32",
                   default="float32", help="store features as float32 (default)")
    g.add_argument("--float16", dest="feature_dtype", action="store_const", const="float16",
                   help="store features as float16 (half the disk and memory)")
    p.add_argument("--cache-dir", default=None,
                   help="feature stores folder (default $SPMLKIT_CACHE/features or "
                        "~/.cache/spmlkit/features)")
    p.add_argument("--weights", default=None, metavar="FILE",
                   help="your own weights for --backbone instead of its pretrained ones: a "
                        "state dict of that architecture (saved by spmlkit, torchvision or "
                        "timm; module. / model. prefixes and the ImageNet classifier are "
                        "handled; keys that do not match are named)")


def _feature_data(args, data: dict | None = None) -> dict:
    """The dataset options of ``--backbone`` / ``--float16`` / ``--cache-dir``, merged with the
    extraction settings given as ``--data features={...}`` (those win)."""
    from .features import feature_options

    options = feature_options(getattr(args, "backbone", None), args.feature_dtype, args.cache_dir,
                              weights=getattr(args, "weights", None))
    given = (data or {}).get("features")
    if options and given is not None:
        if not isinstance(given, dict):
            raise ValueError(f"--data features={given!r}: with --backbone, expected a JSON "
                             f"object of extraction settings, e.g. --data "
                             f"'features={{\"num_workers\": 0}}'")
        options["features"] = {**options.get("features", {}), **given}
    return options


def cmd_extract(args) -> int:
    import time

    from .data import load_dataset
    from .features import feature_dataset, require_images

    ds = require_images(load_dataset(args.dataset, **_data(args)))
    if args.limit is not None:
        ds.pool, ds.test = (s.subset(np.arange(min(args.limit, len(s)))) for s in (ds.pool,
                                                                                    ds.test))
    t0 = time.perf_counter()
    out = feature_dataset(ds, args.backbone, transform=args.transform, size=args.size,
                          batch_size=args.batch_size, num_workers=args.workers,
                          dtype=args.feature_dtype, cache_dir=args.cache_dir,
                          pretrained=not args.random_init, device=args.device,
                          progress=not args.quiet, recompute=args.recompute,
                          weights=args.weights)
    seconds = time.perf_counter() - t0
    for what, s, store in zip(("pool", "test"), (out.pool, out.test), out.meta["feature_stores"]):
        print(f"{args.dataset} {what}: {s.x.shape[0]} x {s.x.shape[1]} {s.x.dtype} -> {store}")
    print(f"{len(out.pool) + len(out.test)} images in {seconds:.1f} s (stores already complete "
          f"are reused, not recomputed)")
    return 0


def cmd_train(args) -> int:
    """``spml train``: one run of any registered method (``--mode``), or ``--resume RUN_DIR``."""
    import torch

    from .data import load_splits
    from .engine import TrainConfig
    from .methods import default_lr, get_method, resolve_k, resume_run, train_run

    if args.resume:
        from .runs import read_run

        method = get_method(read_run(args.resume).config.get("mode", "linear"))
        bar, show = _epoch_bar(args, None, f"resume {args.resume}")
        try:
            res = resume_run(args.resume, on_epoch=show, device=args.device,
                             **_resume_overrides(args, method))
        finally:
            bar.close()
        return _print_result(args, res)
    method = get_method(args.mode)
    ctx = _processes(method, args)
    images = method.inputs == "images"  # else --backbone names the features to train on
    data = _data(args)
    args.dataset = _dataset(args)
    options = {**data, **({} if images else _feature_data(args, data))}
    if options.get("protocol") == "tabular":  # a trial of the tabular protocol: its own split
        options.setdefault("seed", args.seed)
    quiet = {"features": {**options.get("features", {}), "progress": False}} \
        if args.quiet and "backbone" in options else {}  # for this load, not the run's config
    if args.regime is None:  # your own observed training labels train as they are
        args.regime = "given" if options.get("train_labels") == "observed" else "1p"
    splits = load_splits(args.dataset, args.regime, **{**options, **quiet})
    if ctx.is_main:
        _describe_features(splits.meta, bool(splits.meta.get("standardize")))
    hparams = _pairs(args.hp, "--hp")
    if args.reg:
        hparams["reg"] = args.reg
    k = args.k
    if args.k_estimate:  # from train rows, or val rows when the training labels are partial
        split = "train" if splits.train_labels_complete else "val"
        if args.k_estimate > len(getattr(splits, split)):
            raise ValueError(f"--k-estimate {args.k_estimate}: the {split} split of "
                             f"{args.dataset!r} has only {len(getattr(splits, split))} rows")
        k = resolve_k(f"estimate:{args.k_estimate}:point", splits, args.seed, report=True)
    device = args.device or ("cuda" if images and torch.cuda.is_available() else "cpu")
    lr, why = (args.lr, None) if args.lr is not None else \
        default_lr(method, args.loss, splits.name)
    config = TrainConfig(epochs=args.epochs or method.default_epochs,
                         batch_size=args.batch_size or method.default_batch_size, lr=lr,
                         seed=args.seed, early_stop=args.early_stop, device=device,
                         head_lr_mult=args.head_lr_mult, amp=args.amp,
                         num_workers=args.workers, image_size=args.image_size,
                         metric=args.metric)
    method_options = _method_options(args, method)
    bar, show = _epoch_bar(args, method.total_epochs(config, method_options) if ctx.is_main
                           else 0, f"{args.loss} {method.name} on {args.dataset}")
    try:
        res = train_run(method, splits, args.loss, hparams, config, k=k, out=args.out,
                        on_epoch=show, dataset_options=options, **method_options)
        if ctx.world_size > 1:  # every process done before any tears the group down (gloo
            torch.distributed.barrier()  # aborts on a destroy racing a peer's last collective)
    finally:
        bar.close()
        if ctx.world_size > 1:
            torch.distributed.destroy_process_group()
            # free DDP's reducers and their finished gloo work now: left to interpreter
            # shutdown, freeing them can abort the process ("terminate called without an active
            # exception"; seen about once in 20 test-suite runs, after all work was done)
            import gc

            gc.collect()
    if why is not None and ctx.is_main:  # after the run, so an input error stays the one line
        print(f"lr {lr:g}: {why} (--lr sets another)", file=sys.stderr)
    return _print_result(args, res) if ctx.is_main else 0


def _processes(method, args):
    """The torchrun context: a method that runs in many processes starts its process group;
    any other refuses to run under torchrun."""
    import os

    from .distributed import current_context, init_distributed

    if method.processes:
        import torch

        images = method.inputs == "images"
        return init_distributed(args.device or ("cuda" if images and torch.cuda.is_available()
                                                else "cpu"))
    if int(os.environ.get("WORLD_SIZE", "1") or 1) > 1:
        runs_many = ", ".join(m.name for m in _methods() if m.processes)
        raise ValueError(f"--mode {method.name} runs in one process; torchrun "
                         f"--nproc_per_node=N is for --mode {runs_many} (for many linear runs "
                         f"at once use spml benchmark --jobs)")
    return current_context("cpu")


def _methods():
    from .methods import list_methods

    return list_methods()


def _flag_options(args) -> dict:
    """Every method option a ``spml train`` flag gives (None: not given, the method's default
    stands). A method takes the ones it declares (``TrainingMethod.options``)."""
    return {"save_train_probs": args.save_train_probs or None,
            "head": getattr(args, "head", None), "hidden": getattr(args, "hidden", None),
            "backbone": args.backbone, "pretrained": False if args.random_init else None,
            "linear_epochs": args.linear_epochs, "linear_lr": args.linear_lr,
            "feature_dtype": args.feature_dtype, "lac": _pairs(args.lac, "--lac") or None,
            "cache_dir": args.cache_dir,
            "backbone_options": _weights_option(args),
            "progress": False if args.quiet else None}


def _weights_option(args) -> dict | None:
    """``backbone_options`` of ``--weights FILE`` (an absolute path), for the methods that
    build the backbone themselves (finetune, linear_init, lac)."""
    if getattr(args, "weights", None) is None:
        return None
    from pathlib import Path

    if not args.backbone and args.mode != "lac":
        raise ValueError(f"--weights {args.weights}: weights are for a backbone; give "
                         f"--backbone NAME too (spml list backbones)")
    return {"weights": str(Path(args.weights).resolve())}


def _method_options(args, method) -> dict:
    given = {k: v for k, v in _flag_options(args).items()
             if v is not None and k in method.options}
    given.update(_pairs(getattr(args, "option", None), "--option"))  # unknown keys: refused
    if method.inputs == "images" and "backbone" in method.options and not args.backbone and \
            method.options.get("backbone") is None and not method.accepts_vectors:
        raise ValueError(f"--mode {method.name} needs --backbone NAME (spml list backbones)")
    return given


def _resume_overrides(args, method) -> dict:
    """Options a resume may change: what is shown and where caches are, nothing that changes
    results."""
    flags = _flag_options(args)
    return {k: flags[k] for k in ("progress", "cache_dir") if k in method.options
            and flags[k] is not None}


def _epoch_bar(args, total, desc: str):
    from tqdm import tqdm

    from .metrics import METRICS

    bar = tqdm(total=total, desc=desc, unit="epoch", disable=args.quiet or total == 0)

    def show(rec, *_):
        shown = {key: rec[key] for key in ("phase", "stage") if key in rec}
        shown["loss"] = f"{rec['train_loss']:.4f}"
        if rec.get("val_map") is not None:
            shown["val_map"] = f"{rec['val_map']:.2f}"
        shown.update({f"val_{name}": f"{rec[f'val_{name}']:.4f}" for name in METRICS
                      if name != "map" and rec.get(f"val_{name}") is not None})  # --metric
        if "val_source" in rec:
            shown["by"] = rec["val_source"]
        bar.set_postfix(shown)
        bar.update()
    return bar, show


def _print_result(args, res: dict) -> int:
    where = ", ".join(str(v) for v in (res.get("regime"), res.get("backbone")) if v)
    best = f"best epoch {res['best_epoch']}"
    if "best_stage" in res:
        best += f" (stage {res['best_stage']}, {res['best_source']})"
    recovery = res.get("train_recovery_map")
    recovery = "n/a (partial training labels)" if recovery is None else f"{recovery:.2f}"
    if res.get("labels"):
        print(f"labels: {res['labels']}")
    print(f"{res['loss']} {res.get('mode', 'linear')} ({where}): {best}, val mAP "
          f"{res['val_map']:.2f}, test mAP {res['test_map']:.2f}, train recovery mAP "
          f"{recovery}  [{res['seconds']:.1f} s]")
    test = res.get("test_metrics")
    if test:
        from .metrics import METRICS

        on = res.get("metric", "map")
        if on != "map":
            print(f"selected on val {on}: {res['val_score']:.{METRICS[on][1]}f}")
        print("test: " + ", ".join(f"{name} {test[name]:.{METRICS[name][1]}f}"
                                   for name in METRICS if name != "map"
                                   and test.get(name) is not None))
    if res.get("run_dir"):
        print(f"run folder: {res['run_dir']}")
    for warning in res.get("warnings") or []:
        print(f"warning: {warning}", file=sys.stderr)
    return 0


def cmd_predict(args) -> int:
    from pathlib import Path

    from .predict import predict_run, write_predictions

    fmt = args.format or ("json" if args.out and Path(args.out).suffix.lower() == ".json"
                          else "csv")
    pred = predict_run(args.run, args.inputs, args.threshold, device=args.device,
                       batch_size=args.batch_size, num_workers=args.workers)
    text = write_predictions(pred, fmt, args.out, args.run)
    if args.out:
        print(f"wrote {args.out} ({len(pred.items)} rows, {fmt}, threshold {pred.threshold_kind})",
              file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


def _add_finetune(p: argparse.ArgumentParser) -> None:
    import os

    p.add_argument("--mode", default="linear", metavar="METHOD",
                   help="linear: a linear head on features (default); finetune: the --backbone "
                        "end to end on an image source; linear_init: a linear phase on the "
                        "backbone's cached features, then fine-tuning from that head (Cole et "
                        "al.). finetune / linear_init run under torchrun --nproc_per_node=N; "
                        "lac: LAC (Xie et al. 2022), a label-wise embedding model on the "
                        "--backbone's cached feature maps (default efficientnet_lite0), "
                        "options via --lac; boostlu: BoostLU (Kim et al. 2023), a CAM head on "
                        "the --backbone's cached feature maps, or on feature vectors as 1x1 "
                        "maps, e.g. --loss ll_r --option alpha=5 (spml list methods)")
    p.add_argument("--option", action="append", metavar="KEY=VALUE",
                   help="any option of the --mode's method (spml list methods), e.g. --mode "
                        "smile --option p=0.1 --option bias=true (repeatable)")
    p.add_argument("--lac", action="append", metavar="KEY=VALUE",
                   help="--mode lac: a LACConfig option, e.g. --lac dim=64 --lac plc=false "
                        "--lac stage1_epochs=10 (repeatable; spmlkit.methods.lac.LACConfig)")
    p.add_argument("--resume", default=None, metavar="RUN_DIR",
                   help="continue an interrupted run (any --mode) from its checkpoint, with "
                        "the settings in its config.json (--device, --cache-dir and --quiet "
                        "may change; the other options are ignored)")
    p.add_argument("--head-lr-mult", type=_positive, default=1.0,
                   help="fine-tuning: the head's learning rate is lr times this (Kim et al.: 10)")
    p.add_argument("--amp", choices=["auto", "none", "bf16", "fp16"], default="auto",
                   help="fine-tuning on CUDA: autocast dtype (auto: bf16 where supported); the "
                        "loss is always float32")
    p.add_argument("--workers", type=_whole(0), default=min(4, os.cpu_count() or 1),
                   help="fine-tuning: image-loading processes per training process")
    p.add_argument("--image-size", type=_whole(1), default=None,
                   help="fine-tuning: input side (default: the backbone's)")
    p.add_argument("--device", type=_device, default=None,
                   help="fine-tuning: cpu or cuda (default: cuda if there; with torchrun each "
                        "process takes cuda:LOCAL_RANK)")
    p.add_argument("--random-init", action="store_true",
                   help="fine-tuning: start the backbone from random weights")
    p.add_argument("--linear-epochs", type=_whole(1), default=None,
                   help="linear_init: epochs of the linear phase (default 25)")
    p.add_argument("--linear-lr", type=_positive, default=None,
                   help="linear_init: learning rate of the linear phase (default --lr)")


def cmd_benchmark(args) -> int:
    """``spml benchmark``: the paper's grid as a study in ``--out`` (resumable, one launch at a
    time), its table printed and written."""
    from .experiments.benchmark import run_benchmark
    from .experiments.study import DEFAULT_GRID

    if args.seeds < 1:
        raise ValueError(f"--seeds must be >= 1, got {args.seeds}")
    grid = {"batch_size": tuple(args.batch_sizes or DEFAULT_GRID["batch_size"]),
            "lr": tuple(args.lrs or DEFAULT_GRID["lr"])}
    refs = [] if args.no_references else ["bce", "iun"]
    options = {**_data(args), **_feature_data(args)}
    args.dataset = _dataset(args)
    given = {"epochs": args.epochs} if args.epochs is not None else {}  # else the paper's 25
    if args.dataset == "tabular" and "path" in options:  # the columns, before any run
        from .data import load_dataset

        ds = load_dataset(args.dataset, **options)
        _describe_features(ds.meta, ds.standardize)
        del ds
    res = run_benchmark(args.dataset, args.losses, refs, args.seeds, args.out, args.jobs,
                        grid=grid, early_stop=args.early_stop, dataset_options=options,
                        metric=args.metric, regime=args.regime,
                        progress=not args.quiet, argv=sys.argv,
                        vectorise=not args.no_vectorise, **given)
    print(res["table"] if res["results"] else "no grid point finished: nothing to tabulate")
    print(f"wrote {args.out}/results.json and {args.out}/table.md (a study folder: spml study "
          f"status | table | export {args.out}, spml report {args.out})")
    groups, missing = res["failure_groups"], res["missing"]
    if groups:
        failed = sum(g["count"] for g in groups)
        print(f"{failed} grid point(s) failed and were left out of the selection"
              + (", all for the same reason:" if len(groups) == 1 else ":"), file=sys.stderr)
        for g in groups[:3]:
            print(f"  {g['count']} run(s): {g['reason']} (first: {g['run_ids'][0]})",
                  file=sys.stderr)
        if len(groups) > 3:
            print(f"  {sum(g['count'] for g in groups[3:])} more run(s) with "
                  f"{len(groups) - 3} other error(s)", file=sys.stderr)
        print(f"full tracebacks: spml report {args.out} (grouped), or spml study export "
              f"{args.out} --format json --output errors.json", file=sys.stderr)
    if missing:
        shown = ", ".join(f"{label} (seed {seed})" for label, seed in missing[:6])
        more = f" and {len(missing) - 6} more" if len(missing) > 6 else ""
        print(f"spml benchmark: error: no grid point finished for {shown}{more}: the table "
              f"lacks {'them' if len(missing) > 1 else 'it'}", file=sys.stderr)
        return 1
    return 0


FORCE_HELP = "overwrite the output file if it exists (default: write the next free name, " \
             "e.g. curves-2.png)"


def _wrote(path, wanted) -> None:
    """``wrote PATH``, saying so when an existing file made it take another name."""
    from pathlib import Path

    note = "" if Path(path) == Path(wanted) else f" ({wanted} exists; --force overwrites it)"
    print(f"wrote {path}{note}")


def cmd_analyze(args) -> int:
    from . import analysis as an
    from .experiments import figures as fg

    if args.analysis == "pl-precision":
        results = [an.pseudo_label_precision(run) for run in args.runs]
        for r in results:
            print(f"{r.run} ({r.loss})\n{r.table()}\n")
        out = fg.plot_pl_precision(results, args.out, force=args.force)
    elif args.analysis == "ap-diff":
        res = an.classwise_ap_difference(args.run_a, args.run_b, args.split)
        print(res.table())
        out = fg.plot_ap_difference(res, args.out, force=args.force)
    elif args.analysis == "wasserstein":
        results = [an.run_wasserstein(run) for run in args.runs]
        print(an.wasserstein_table(results))
        out = fg.plot_wasserstein(results, args.out, force=args.force)
    else:
        res = an.unobserved_positive_histograms(args.run, args.epochs, args.bins)
        print(res.table())
        out = fg.plot_histograms(res, args.out, force=args.force)
    _wrote(out, args.out)
    return 0


def cmd_figure(args) -> int:
    from pathlib import Path

    from .experiments import figures as fg

    kind = args.figure
    base = Path(args.study if kind == "sweep" else args.runs[0] if kind == "curves" else args.run)
    name = f"sweep-{args.axis}" if kind == "sweep" else kind
    wanted = args.out or base / fg.FIGURES_DIR / f"{name}.png"
    force = args.force
    if kind == "curves":
        labels = args.labels.split(",") if args.labels else None
        out = fg.plot_curves(fg.curves_from_runs(args.runs, labels), wanted, args.metric,
                             force=force)
    elif kind == "sweep":
        lines, title = fg.sweep_from_study(args.study, args.axis, args.metric)
        print(fg.sweep_table(lines, args.axis, args.metric))
        out = fg.plot_sweep(lines, args.axis, wanted, args.metric, title, force=force)
    elif kind == "histograms":
        h = fg.histograms_from_run(args.run, args.bins)
        print(h.table())
        out = fg.plot_probability_histograms(h, wanted, force=force)
    elif kind == "landscape":
        ls = fg.landscape_from_run(args.run, steps=args.steps, span=args.span, seed=args.seed,
                                   max_examples=args.max_examples)
        print(ls.summary())
        out = fg.plot_landscape(ls, wanted, force=force)
    elif kind == "panel":
        out = fg.plot_panel(fg.panel_from_run(args.run, args.split, args.n, args.seed), wanted,
                            args.top, force=force)
    else:
        loader = fg.cam_from_run if kind == "cam" else fg.attention_from_run
        ov = loader(args.run, args.split, args.n, args.seed)
        if ov.note:
            print(ov.note)
        out = fg.plot_overlays(ov, wanted, args.top, force=force)
    _wrote(out, wanted)
    return 0


def cmd_report(args) -> int:
    from pathlib import Path

    from .experiments.report import REPORT_FILE, write_report

    out = write_report(args.study, args.out, force=args.force)
    _wrote(out, args.out or Path(args.study) / REPORT_FILE)
    if args.open:
        import webbrowser

        webbrowser.open(out.resolve().as_uri())
    return 0


def _study_table(out, fmt: str = "markdown", metric: str = "test_map",
                 columns: str = "dataset", select: str | None = None) -> str:
    """The table of a study folder. ``metric``: a results column or metrics key (shown as
    is, the grid point selected on the spec's metric), a name of
    :data:`spmlkit.metrics.METRICS` (its test value, the grid point selected on its val value
    with its direction, unless ``select`` names another), or several such names separated by
    commas (one column each; selection on ``select``, default the spec's ``metric``)."""
    from .experiments.store import select_best
    from .experiments.study import open_study
    from .experiments.tables import metric_column, metrics_table, study_table
    from .metrics import METRICS, check_metric, higher_is_better

    study = open_study(out)
    if not study.selected:
        raise ValueError(f"{out}: no finished run to tabulate yet (spml study status {out})")
    names = [m.strip() for m in metric.split(",") if m.strip()]
    order = [m.label for m in study.spec.methods]
    labels = study.spec.row_labels()  # a method trained in another mode: "an [smile]"
    if len(names) > 1 or (names and names[0] in METRICS):
        by = check_metric(select) if select else \
            (names[0] if len(names) == 1 else study.spec.metric)
        selected = select_best(study.rows, by)
        if not selected:
            raise ValueError(f"{out}: no finished run has a val {by} (runs from before the "
                             f"classic metrics were recorded lack them)")
        title = f"{study.title} (test; grid point selected on val {by}, best epoch on val " \
                f"{study.spec.metric})"
        if len(names) > 1:
            return metrics_table(selected, names, fmt, title=title, order=order,
                                 labels=labels)
        name = names[0]
        return study_table(selected, fmt, metric_column(name), columns=columns, title=title,
                           order=order, decimals=METRICS[name][1],
                           higher_is_better=higher_is_better(name), labels=labels)
    if select:
        raise ValueError("--select needs --metric to name metrics of spml list metrics "
                         f"({', '.join(METRICS)}), not {metric!r}")
    return study_table(study.selected, fmt, metric, columns=columns, title=study.title,
                       order=order, labels=labels)


def _study_source(args) -> tuple:
    """``(spec, overrides)`` of ``spml study run``: the spec (or, without one, a study made of
    the flags alone) and the flags as overrides."""
    flags = {"datasets": args.datasets and args.datasets.split(","),
             "methods": args.methods and args.methods.split(","), "seeds": args.seeds,
             "name": args.name}
    flags = {k: v for k, v in flags.items() if v}
    if args.spec is not None:
        return args.spec, [*args.set, *(f"{k}={json.dumps(v)}" for k, v in flags.items())]
    if "datasets" not in flags or "methods" not in flags:
        raise ValueError("spml study run needs a spec (a YAML file, a study folder or a preset: "
                         "spml study list) or --datasets and --methods")
    return {"name": "study", **flags}, args.set


def _print_failures(res: dict, shown: int = 3) -> None:
    """On stderr: this launch's failed runs grouped by their error, the most common first
    (its last line, how many runs share it, the first such run), and where the tracebacks
    are."""
    groups = res.get("failure_groups") or []
    if not groups:
        return
    every = res["failures"] == res["runs_run"]
    print(f"{'every one' if every else res['failures']} of the {res['runs_run']} run(s) of "
          f"this launch failed" + (", all for the same reason:" if len(groups) == 1 else ":"),
          file=sys.stderr)
    for g in groups[:shown]:
        print(f"  {g['count']} run(s): {g['reason']} (first: {g['run_ids'][0]})",
              file=sys.stderr)
    if len(groups) > shown:
        rest = sum(g["count"] for g in groups[shown:])
        print(f"  {rest} more run(s) with {len(groups) - shown} other error(s)", file=sys.stderr)
    print(f"full tracebacks: spml report {res['out']} (grouped), or spml study export "
          f"{res['out']} --format json --output errors.json", file=sys.stderr)


def cmd_study(args) -> int:
    """``spml study run | status | table | export | list``."""
    from .experiments import study as st

    if args.action == "list":
        presets = st.list_presets()
        width = max((len(n) for n, _ in presets), default=0)
        for name, title in presets:
            print(f"{name:<{width}}  {title}")
        return 0
    if args.action == "run":
        spec = st.load_study(*_study_source(args))
        try:
            res = st.run_study(spec, out=args.out, jobs=args.jobs, progress=not args.quiet,
                               mlflow=args.mlflow, argv=sys.argv,
                               retry_failed=args.retry_failed, retries=args.retries,
                               threads=args.threads, checkpoint_seconds=args.checkpoint_seconds,
                               dask=args.dask or args.scheduler,
                               scheduler_file=args.scheduler_file,
                               vectorise=not args.no_vectorise)
        except (KeyboardInterrupt, SystemExit):  # Ctrl-C, or SIGTERM (kill, timeout)
            out = args.out or st.STUDIES_ROOT / spec.name
            with contextlib.suppress(Exception):
                s = st.study_status(out)
                print(f"{spec.name}: stopped with {s['done']} of {s['total']} runs done; the "
                      f"same command runs the {s['missing']} missing ones", file=sys.stderr)
            raise
        print(f"{spec.name}: {res['runs_run']} run(s) in {res['seconds']:.1f} s on "
              f"{res['executor']}, {res['failures']} failed; "
              f"{res['runs_done_before']} of {res['runs_total']} were finished before")
        try:  # a study selected on another metric shows it (its test value)
            print(_study_table(res["out"], metric="test_map" if spec.metric == "map"
                               else spec.metric), end="")
        except ValueError as err:
            print(err)
        print(f"study folder: {res['out']}")
        _print_failures(res)
        return 1 if res["failures"] else 0
    if args.action == "status":
        s = st.study_status(args.dir)
        print(f"{s['name']} ({s['title']}): {s['total']} runs: {s['done']} done, "
              f"{s['failed']} failed, {s['missing']} missing"
              + (f"; {s['stale']} stored run(s) not in the current spec" if s["stale"] else ""))
        return 0
    if args.action == "table":
        print(_study_table(args.dir, args.format, args.metric, args.columns, args.select),
              end="")
        return 0
    study = st.open_study(args.dir)
    if not study.has_results:
        raise FileNotFoundError(f"{study.results_path} is missing: the study has not run yet")
    path = study.export(args.output, args.format, selected=args.selected,
                        include_stale=args.all, force=args.force)
    _wrote(path, args.output)
    if study.stale and not args.all:
        print(f"{len(study.stale)} stored run(s) of an earlier version of the spec left out "
              f"(--all includes them)")
    return 0


def cmd_list(args) -> int:
    if args.names and args.what != "datasets":
        raise ValueError(f"names after 'spml list {args.what}' are for datasets only "
                         f"(spml list datasets NAME --details), got {' '.join(args.names)}")
    if args.what == "datasets" and (args.details or args.names):
        from .data import DATASETS
        from .data.options import format_options
        from .features import feature_option_rows

        names = args.names or DATASETS.names()
        for name in names:
            DATASETS.get(name)  # an unknown name: the registry's error, with suggestions
        print("\n\n".join(format_options(name, feature_rows=feature_option_rows())
                          for name in names))
        print("\n(give options as --data KEY=VALUE to spml train / benchmark / extract, under "
              "a study's datasets: [{name: ..., options: {...}}], or as keywords to "
              "spmlkit.data.load_splits)")
        return 0
    if args.what == "losses":
        from .losses import LOSSES

        rows = [(e.name + (f" ({', '.join(e.aliases)})" if e.aliases else ""), e.description,
                 e.paper) for e in LOSSES.entries()]
    elif args.what == "datasets":
        from .data import DATASETS

        rows = [(e.name, e.description, e.paper) for e in DATASETS.entries()]
    elif args.what == "methods":
        from .methods import list_methods

        rows = [(m.name, f"{m.description} (inputs: {m.inputs}"
                 f"{' or feature vectors' if m.accepts_vectors else ''}; options: "
                 f"{', '.join(sorted(m.options)) or 'none'})", m.paper) for m in list_methods()]
    elif args.what == "backbones":
        from .models.backbones import BACKBONES, list_backbones

        papers = {e.name: e.paper for e in BACKBONES.entries()}
        rows = [(name, desc, papers.get(name, "")) for name, desc in list_backbones()]
    elif args.what == "metrics":
        from .metrics import METRICS

        rows = [(name, f"{desc} ({'higher' if up else 'lower'} is better)", "")
                for name, (up, _, desc) in METRICS.items()]
    else:
        from .labels import REGIMES

        rows = [(name, desc, "") for name, desc in REGIMES.items()]
    if args.markdown:  # the README's tables are generated this way
        singular = {"losses": "loss", "datasets": "dataset", "regimes": "regime",
                    "backbones": "backbone", "methods": "method",
                    "metrics": "metric"}[args.what]
        print(f"| {singular} | paper | description |\n|---|---|---|")
        for name, desc, paper in rows:
            print(f"| `{name}` | {paper} | {desc.replace('|', '/')} |")
        return 0
    width = max((len(r[0]) for r in rows), default=0)
    for name, desc, _ in rows:
        print(f"{name:<{width}}  {desc}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    from .experiments.benchmark import DEFAULT_LOSSES

    parser = argparse.ArgumentParser(prog="spml", description="Single-positive multi-label "
                                     "learning: train and compare the published methods.")
    from . import __version__

    parser.add_argument("--version", action="version", version=f"spml (spmlkit) {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("train", help="train one method, print val/test mAP, write a run folder")
    _add_common(p)
    p.add_argument("--loss", default="an", help="registered loss (spml list losses)")
    p.add_argument("--regime", default=None, help="full | 1p_alln | 1p_1n | 1p | mlml:<rate> | "
                   "given (your own observed training labels: --data train_labels=observed); "
                   "default 1p, or given with --data train_labels=observed")
    p.add_argument("--hp", action="append", metavar="KEY=VALUE",
                   help="loss hyperparameter, e.g. --hp lam=2 (repeatable)")
    p.add_argument("--reg", action="append", metavar="NAME:WEIGHT",
                   help="add a regulariser to the loss, e.g. --reg highrank:1e-3")
    p.add_argument("--batch-size", type=_whole(1), default=None,
                   help="default 8 (Cole et al.'s linear and fine-tuned runs); 32 with --mode "
                        "lac (Xie et al.)")
    p.add_argument("--lr", type=_positive, default=None,
                   help="learning rate (default: the value the paper selected for the loss "
                        "where known, else the method's default: 1e-3 for a linear head, 1e-4 "
                        "fine-tuned; the value used and why are printed)")
    p.add_argument("--seed", type=SEED, default=0)
    p.add_argument("--k", type=_positive, default=None,
                   help="expected positives per example (default: the train split's mean)")
    p.add_argument("--k-estimate", type=_whole(1), default=None, metavar="M",
                   help="estimate k from M fully labelled train rows (Cole et al. App. B; val "
                        "rows with --regime given)")
    p.add_argument("--out", default="runs", help="parent folder of the run folder")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--save-train-probs", action="store_true",
                   help="store the train probabilities after every epoch (train_probs.npy, "
                        "float16) for `spml analyze histograms`")
    p.add_argument("--head", choices=["linear", "mlp"], default=None,
                   help="linear mode: the head on the features, linear (default) or mlp (one "
                        "hidden ReLU layer, the tabular SPML protocol's MLP)")
    p.add_argument("--hidden", type=_whole(1), default=None,
                   help="--head mlp: hidden units (default 256)")
    _add_backbone(p)
    _add_finetune(p)
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("predict", help="label new inputs with a run folder's best model and "
                       "the thresholds chosen on val")
    p.add_argument("run", metavar="RUN", help="a run folder (spml train)")
    p.add_argument("inputs", nargs="+", metavar="INPUTS",
                   help="linear runs: .npy/.npz feature files (runs of the tabular source: "
                        ".csv/.parquet tables too, feature columns by name); fine-tuned runs (and "
                        "linear runs on --backbone features): image files or folders")
    p.add_argument("--threshold", default="global",
                   help="global (maximises val micro-F1, default), per-class (each class's "
                        "val-F1 maximiser) or a probability, e.g. 0.5")
    p.add_argument("--format", choices=["csv", "json"], default=None,
                   help="default: json when --out ends with .json, else csv")
    p.add_argument("--out", default=None, metavar="FILE", help="default: standard output")
    p.add_argument("--device", type=_device, default="cpu")
    p.add_argument("--batch-size", type=_whole(1), default=64)
    p.add_argument("--workers", type=_whole(0), default=0, help="image-loading processes")
    p.set_defaults(func=cmd_predict)

    p = sub.add_parser("benchmark", help="the paper's grid for several methods and seeds",
                       description="The paper's grid (batch sizes x learning rates) for every "
                       "method and seed, selected on val, as a resumable study folder. Exit "
                       "status 1 when a method x seed has no finished grid point (its row "
                       "would be missing from the table); failed grid points are listed "
                       "grouped by their error either way.")
    _add_common(p)
    p.add_argument("--losses", default=",".join(DEFAULT_LOSSES),
                   help="comma-separated losses, loss@regime, or 'all' (default: %(default)s)")
    p.add_argument("--no-references", action="store_true",
                   help="leave out the bce (full labels) and iun reference rows (left out "
                        "anyway, with a note, on data whose training labels are observed ones)")
    p.add_argument("--regime", default=None,
                   help="the regime of every method given without @regime: 1p (default) or "
                        "another of spml list regimes; given (your own observed training "
                        "labels) is the default, and the only one that runs, when --data "
                        "train_labels=observed says the data's training labels are the "
                        "observed ones (1 / 0 / -1 or empty cells)")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--batch-sizes", type=_ints, default=None, help="grid, default 8,16")
    p.add_argument("--lrs", type=_floats, default=None, help="grid, default 1e-2,1e-3,1e-4,1e-5")
    p.add_argument("--jobs", type=int, default=None, help="worker processes (default: cores)")
    p.add_argument("--no-vectorise", action="store_true",
                   help="train every grid point alone (default: the linear mode trains the "
                        "runs that differ only in seed and learning rate together, as one "
                        "stacked model; same results up to float summation order)")
    p.add_argument("--out", default="runs/benchmark",
                   help="output folder, a study folder; re-running with the same folder runs "
                        "only the grid points it is missing")
    p.add_argument("--quiet", action="store_true")
    _add_backbone(p)
    p.set_defaults(func=cmd_benchmark)

    p = sub.add_parser("extract", help="compute the backbone features of an image source once "
                       "(memory-mapped store, resumable; reused by train/benchmark --backbone)")
    p.add_argument("--dataset", required=True, help="registered image source")
    p.add_argument("--data", action="append", metavar="KEY=VALUE",
                   help="dataset option, e.g. --data root=/data/pascal (repeatable)")
    _add_backbone(p, default="efficientnet_lite0")
    p.add_argument("--transform", default="eval", choices=["eval", "weak", "strong"])
    p.add_argument("--size", type=_whole(1), default=None,
                   help="input side (default: the backbone's)")
    p.add_argument("--batch-size", type=_whole(1), default=32)
    p.add_argument("--workers", type=_whole(0), default=None,
                   help="image decoding processes (default: cores - 1, at most 8)")
    p.add_argument("--limit", type=_whole(1), default=None, metavar="N",
                   help="only the first N images of pool and test (a quick try)")
    p.add_argument("--device", type=_device, default=None,
                   help="cpu, cuda, cuda:1 (default: cuda if there)")
    p.add_argument("--random-init", action="store_true", help="backbone without pretrained "
                   "weights")
    p.add_argument("--recompute", action="store_true", help="discard the stores and recompute")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_extract)

    p = sub.add_parser("analyze", help="the papers' analyses of finished run folders: a table "
                       "and a PNG figure")
    asub = p.add_subparsers(dest="analysis", required=True)
    a = asub.add_parser("pl-precision", help="pseudo-label count and precision per epoch "
                        "(em_apl, ll_cp, soft_opml, opml_sp runs; Zhou et al. Table 2)")
    a.add_argument("runs", nargs="+", metavar="RUN", help="run folders")
    a = asub.add_parser("ap-diff", help="per-class AP of RUN_B minus RUN_A (Zhou et al. "
                        "Fig. 4c)")
    a.add_argument("run_a", metavar="RUN_A")
    a.add_argument("run_b", metavar="RUN_B")
    a.add_argument("--split", choices=["train", "val", "test"], default="test")
    a = asub.add_parser("wasserstein", help="per-class Wasserstein-1 distance between unobserved "
                        "positives and negatives on the train split (Zhou et al. Fig. 4a)")
    a.add_argument("runs", nargs="+", metavar="RUN", help="run folders")
    a = asub.add_parser("histograms", help="histograms of the unobserved positives' predicted "
                        "probabilities at chosen epochs (Cole et al. Fig. 2; needs a run "
                        "trained with --save-train-probs)")
    a.add_argument("run", metavar="RUN")
    a.add_argument("--epochs", type=_ints, default=None,
                   help="comma-separated 1-based epochs, e.g. 1,5,25 (default: first, middle, "
                        "last)")
    a.add_argument("--bins", type=int, default=20)
    for a in asub.choices.values():
        a.add_argument("--out", required=True, metavar="FILE",
                       help="where to write the figure (.png or .svg)")
        a.add_argument("--force", action="store_true", help=FORCE_HELP)
    p.set_defaults(func=cmd_analyze)

    p = sub.add_parser("figure", help="the papers' figures of runs and studies (PNG, or SVG "
                       "with --out *.svg)")
    fsub = p.add_subparsers(dest="figure", required=True)
    f = fsub.add_parser("curves", help="val mAP and train loss per epoch of runs (OPML Fig. 4)")
    f.add_argument("runs", nargs="+", metavar="RUN", help="run folders")
    f.add_argument("--metric", default="val_map", help="epoch-record key (default val_map)")
    f.add_argument("--labels", default=None, help="comma-separated legend labels, one per run")
    f = fsub.add_parser("sweep", help="selected test mAP (mean ± std over seeds) against a "
                        "study's vary axis (LAC Figs. 3-5, Zhou Fig. 3a, Cole Fig. 1)")
    f.add_argument("study", metavar="STUDY_DIR", help="a study folder (runs/studies/<name>)")
    f.add_argument("--axis", required=True,
                   help="vary key: hparams.<name>, data.<option>, k, regime")
    f.add_argument("--metric", default="test_map", help="results column (default test_map)")
    f = fsub.add_parser("histograms", help="train probabilities of observed positives, "
                        "unobserved positives and negatives (Cole Fig. 2, Zhou Fig. 4b)")
    f.add_argument("run", metavar="RUN")
    f.add_argument("--bins", type=int, default=20)
    f = fsub.add_parser("landscape", help="training loss around the trained weights along two "
                        "filter-normalised random directions (Li et al. 2018; Zhou Fig. 5)")
    f.add_argument("run", metavar="RUN")
    f.add_argument("--steps", type=int, default=21, help="grid points per axis")
    f.add_argument("--span", type=float, default=1.0, help="grid half-width")
    f.add_argument("--seed", type=int, default=0, help="seed of the directions")
    f.add_argument("--max-examples", type=int, default=None,
                   help="train rows used (default: all for linear runs, 256 for fine-tuned)")
    f = fsub.add_parser("panel", help="images with their labels and top predictions (Zhou "
                        "Fig. 6)")
    f.add_argument("run", metavar="RUN")
    f.add_argument("--n", type=int, default=8, help="images shown")
    f = fsub.add_parser("cam", help="class activation maps of the top classes (OPML Fig. 7)")
    f.add_argument("run", metavar="RUN")
    f.add_argument("--n", type=int, default=4, help="images shown")
    f = fsub.add_parser("attention", help="a LAC run's label-wise attention maps (LAC Fig. 6)")
    f.add_argument("run", metavar="RUN")
    f.add_argument("--n", type=int, default=4, help="images shown")
    for name in ("panel", "cam", "attention"):
        f = fsub.choices[name]
        f.add_argument("--split", choices=["train", "val", "test"], default="test")
        f.add_argument("--top", type=int, default=3, help="predicted classes shown per image")
        f.add_argument("--seed", type=int, default=0, help="seed of the image choice")
    for f in fsub.choices.values():
        f.add_argument("--out", default=None, metavar="FILE",
                       help="a .png or .svg file (default: <RUN or STUDY_DIR>/figures/"
                            "<figure>.png)")
        f.add_argument("--force", action="store_true", help=FORCE_HELP)
    p.set_defaults(func=cmd_figure)

    p = sub.add_parser("report", help="one self-contained HTML page of a study: tables, "
                       "figures, commands, versions, failures (opens offline)")
    p.add_argument("study", metavar="STUDY_DIR", help="a study folder (runs/studies/<name>)")
    p.add_argument("--out", default=None, metavar="FILE",
                   help="the HTML file (default <STUDY_DIR>/report.html)")
    p.add_argument("--force", action="store_true", help=FORCE_HELP)
    p.add_argument("--open", action="store_true", help="open it in the default browser")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("study", help="run a study (a YAML spec or preset: datasets x methods x "
                       "seeds x vary x grid; parallel, resumable) and tabulate it; `spml study "
                       "PRESET` is `spml study run PRESET`")
    ssub = p.add_subparsers(dest="action", required=True)
    s = ssub.add_parser("run", help="run a study's missing runs (re-running resumes)")
    s.add_argument("spec", metavar="SPEC_OR_PRESET", nargs="?", default=None,
                   help="a study YAML file, a study folder, or a preset (spml study list); "
                        "without it the study is --datasets x --methods x --seeds")
    s.add_argument("--datasets", default=None, metavar="A,B",
                   help="registered datasets, comma-separated (overrides the spec's)")
    s.add_argument("--methods", default=None, metavar="A,B",
                   help="method specs, comma-separated, e.g. an,role,bce@full,an+highrank:1e-3 "
                        "(overrides the spec's)")
    s.add_argument("--seeds", type=_whole(1), default=None, help="seeds per grid point")
    s.add_argument("--name", default=None, help="the study's name (folder runs/studies/NAME)")
    s.add_argument("--out", default=None, help="study folder (default runs/studies/<name>)")
    s.add_argument("--jobs", type=int, default=None, help="worker processes (default: cores)")
    s.add_argument("--no-vectorise", action="store_true",
                   help="train every grid point alone (default: the linear mode trains the "
                        "runs that differ only in seed and learning rate together, as one "
                        "stacked model; same results up to float summation order)")
    s.add_argument("--quiet", action="store_true", help="no progress bar")
    s.add_argument("--mlflow", action="store_true",
                   help="also log each run to MLflow (pip install mlflow)")
    s.add_argument("--set", action="extend", nargs="+", default=[], metavar="KEY=VALUE",
                   help="override spec keys, e.g. --set seeds=1 epochs=5 grid.lr=[1e-3]")
    s.add_argument("--retry-failed", action="store_true", help="run failed runs again")
    s.add_argument("--retries", type=_whole(0), default=1, metavar="N",
                   help="run a run whose worker process died (e.g. out of memory) N more times "
                        "(in the local pool: alone), resuming from its checkpoint, before "
                        "recording it as failed (default 1)")
    s.add_argument("--threads", type=_whole(1), default=None,
                   help="torch threads per worker (default 1 in linear mode, else cores / "
                        "jobs; on a Dask cluster the worker machine's cores)")
    s.add_argument("--checkpoint-seconds", type=float, default=None, metavar="S",
                   help="write a run's resumable checkpoint after an epoch once S seconds "
                        "passed since the last (default 10; 0: every epoch)")
    where = s.add_mutually_exclusive_group()
    where.add_argument("--dask", choices=["local"], default=None,
                       help="run on a Dask LocalCluster of --jobs worker processes "
                            "(pip install -e \".[dask]\" in the clone)")
    where.add_argument("--scheduler", default=None, metavar="ADDRESS",
                       help="run on the Dask cluster of this scheduler (tcp://host:8786); "
                            "the workers need spmlkit and the study folder at the same path")
    where.add_argument("--scheduler-file", default=None, metavar="PATH",
                       help="run on the Dask scheduler this JSON file names (dask scheduler "
                            "--scheduler-file PATH, dask-jobqueue)")
    s = ssub.add_parser("status", help="runs done / failed / missing of a study folder")
    s.add_argument("dir", metavar="DIR")
    s = ssub.add_parser("table", help="the paper-style table of a study folder (mean ± std "
                        "over seeds of the best-val grid point; best bold, second underlined)")
    s.add_argument("dir", metavar="DIR")
    s.add_argument("--format", choices=["md", "markdown", "latex", "csv", "html"], default="md")
    s.add_argument("--metric", default="test_map",
                   help="a results column or a key of the run's metrics (default test_map); "
                        "or a metric name (map, lrap, ranking_loss, coverage, coverage_norm, "
                        "one_error, hamming_loss, micro_f1, macro_f1): its test value, the "
                        "grid point selected on its val value (lower is better for the "
                        "losses); or several names, comma-separated: one column each")
    s.add_argument("--select", default=None, metavar="METRIC",
                   help="with metric names: the val metric the grid point is selected on "
                        "(default: the one shown, or the study's metric for several)")
    s.add_argument("--columns", default="dataset",
                   help="what makes the columns: dataset (default) or a vary key")
    s = ssub.add_parser("export", help="the rows of the current spec's runs (or the selected "
                        "ones) to a file")
    s.add_argument("dir", metavar="DIR")
    s.add_argument("--format", choices=["csv", "md", "markdown", "latex", "json"],
                   required=True)
    s.add_argument("--output", required=True, metavar="FILE")
    which = s.add_mutually_exclusive_group()
    which.add_argument("--selected", action="store_true",
                       help="only the best-val run per (method, dataset, regime, seed, variant)")
    which.add_argument("--all", action="store_true",
                       help="also the stored rows of runs an earlier version of the spec had "
                            "(after a re-run with a changed spec)")
    s.add_argument("--force", action="store_true", help=FORCE_HELP)
    ssub.add_parser("list", help="the shipped presets with their titles")
    p.set_defaults(func=cmd_study)

    p = sub.add_parser("list",
                       help="list registered losses, training methods, datasets, regimes, "
                       "backbones or metrics")
    p.add_argument("what", choices=["losses", "methods", "datasets", "regimes", "backbones",
                                    "metrics"])
    p.add_argument("names", nargs="*", metavar="NAME",
                   help="datasets: only these, with --details implied")
    p.add_argument("--details", action="store_true",
                   help="datasets: every option of each source (--data KEY=VALUE) with its "
                        "type, default and meaning, from the source's signature and docstring")
    p.add_argument("--markdown", action="store_true", help="a Markdown table (for docs)")
    p.set_defaults(func=cmd_list)
    return parser


STUDY_ACTIONS = ("run", "status", "table", "export", "list")
#: the ``dest`` of each command's own subcommands (``spml study run``, ``spml figure curves``)
SUBCOMMANDS = {"study": "action", "figure": "figure", "analyze": "analysis"}


def _prog(args) -> str:
    """``spml <command> [<subcommand>]``, as argparse names it in its own error lines."""
    sub = getattr(args, SUBCOMMANDS.get(args.command, ""), None)
    return f"spml {args.command}" + (f" {sub}" if sub else "")


def _os_message(err: OSError) -> str:
    """``<path>: <reason>`` of an operating-system error (a file that cannot be written or
    read), or its own text when it names no file."""
    if err.filename is None or not err.strerror:
        return str(err)
    paths = err.filename if err.filename2 is None else f"{err.filename} -> {err.filename2}"
    return f"{paths}: {err.strerror}"


def _fail(prog: str, message: str) -> int:
    """Print ``<prog>: error: <message>`` on one line; return exit status 2."""
    text = "; ".join(line.strip() for line in message.splitlines() if line.strip())
    print(f"{prog}: error: {text}", file=sys.stderr)
    return 2


def main(argv=None) -> int:
    """``spml``: parse ``argv``, run the command; a bad input ends in one line
    ``spml <command>: error: <what is wrong and where>`` on stderr and exit status 2."""
    import sqlite3

    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["study"] and len(argv) > 1 and argv[1] not in STUDY_ACTIONS and \
            not argv[1].startswith("-"):
        argv.insert(1, "run")  # `spml study <preset or spec>` is `spml study run ...`
    args = build_parser().parse_args(argv)
    prog = _prog(args)
    if (args.func is cmd_benchmark or (args.func is cmd_study and args.action == "run")) and \
            getattr(args, "jobs", None) != 1 and not getattr(args, "dask", None) and \
            not getattr(args, "scheduler", None) and not getattr(args, "scheduler_file", None):
        from .experiments.pool import start_worker_server

        start_worker_server()  # its imports run while this process imports and plans
    if getattr(args, "threads", None):
        import torch

        torch.set_num_threads(args.threads)
    try:
        return args.func(args)
    except (ValueError, ModuleNotFoundError, FloatingPointError) as err:
        return _fail(prog, str(err))  # what is wrong and where, said by the code that found it
    except OSError as err:  # ours (FileNotFoundError naming the file and what was expected),
        return _fail(prog, _os_message(err))  # else a file the system refused: path, reason
    except sqlite3.Error as err:  # last resort: stores turn the known cases into ValueError
        return _fail(prog, f"the study's results store (SQLite) failed: {err}")
    except KeyboardInterrupt:
        print("interrupted; finished work is kept (re-run the same command to resume)",
              file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
