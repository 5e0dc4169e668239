"""``spml train``: one run of any registered training method, or a resumed one."""
from __future__ import annotations

import sys
from pathlib import Path

from .common import (LazyHelp, _acceleration, _data, _dataset, _describe_features, _device,
                     _feature_data, _losses_help, _methods_help, _pairs, _positive, _whole)
from .groups import add_acceleration, add_backbone, add_data, add_output, add_solver, \
    add_training, field_option


def cmd_train(args) -> int:
    """``spml train``: one run of any registered method (``--mode``), or ``--resume RUN_DIR``."""
    import torch

    from ..loading import load_splits
    from ..engine import TrainConfig
    from ..accel import acceleration
    from ..engine.loop import batch_progress
    from ..losses import check_loss_hparams
    from ..methods import default_lr, get_method, resolve_k, resume_run, train_run

    if args.resume:
        from ..runs import CHECKPOINT_FILE, read_run

        _refuse_resume_flags(args)
        done = read_run(args.resume)
        method = get_method(done.config.get("mode", "linear"))
        ctx = _processes(method, args)  # under torchrun: the process group, as a new run's
        if ctx.is_main and done.final is None and \
                not (Path(args.resume) / CHECKPOINT_FILE).is_file():
            print(f"{args.resume} has no checkpoint (stopped before its first): training it "
                  f"again from epoch 1", file=sys.stderr)
        bar, show = _epoch_bar(args, None if ctx.is_main else 0, f"resume {args.resume}")
        try:
            with acceleration(_acceleration(args)):
                res = resume_run(args.resume, on_epoch=show, device=args.device,
                                 **_resume_overrides(args, method))
            if ctx.world_size > 1:
                torch.distributed.barrier()
        finally:
            bar.close()
            _end_processes(ctx)
        return _print_result(args, res) if ctx.is_main else 0
    args.mode = _mode(args)
    method = get_method(args.mode)
    accel = _acceleration(args)
    if accel.any and method.inputs != "images":
        raise ValueError(f"{' '.join(accel.flags())}: --mode {method.name} trains on feature "
                         f"vectors; these flags speed up the methods that read images (finetune, "
                         f"linear_init, lac, mime, boostlu) and spml extract")
    ctx = _processes(method, args)
    images = method.inputs == "images"  # else --backbone names the features to train on
    data = _data(args)
    args.dataset = _dataset(args)
    from ..data import trial_options

    options = trial_options({**data, **({} if images else _feature_data(args, data))},
                            args.seed)
    quiet = {"features": {**options.get("features", {}), "progress": False}} \
        if args.quiet and "backbone" in options else {}  # for this load, not the run's config
    if args.regime is None:  # your own observed training labels train as they are
        args.regime = "given" if options.get("train_labels") == "observed" else "1p"
    hparams = _pairs(args.hp, "--hp")
    check_loss_hparams(args.loss, hparams)  # before the data loads (seconds, GBs)
    splits = load_splits(args.dataset, args.regime, **{**options, **quiet})
    if ctx.is_main:
        _describe_features(splits.meta, bool(splits.meta.get("standardize")))
    if args.reg:
        hparams["reg"] = args.reg
    k = args.k
    if args.k_estimate and args.k is not None:
        raise ValueError(f"give --k {args.k:g} or --k-estimate {args.k_estimate}, not both")
    if args.k_estimate:  # from train rows, or val rows when the training labels are partial
        k = resolve_k(f"estimate:{args.k_estimate}:point", splits, args.seed, report=True,
                      given=f"--k-estimate {args.k_estimate}")
    device = args.device or ("cuda" if images and torch.cuda.is_available() else "cpu")
    if accel.any:  # before any data is read or folder made
        accel.check(device, f"--mode {method.name}")
    if getattr(args, "solver_by_default", False):  # what the data lacks is said first
        from ..methods import check_inputs

        check_inputs(method, splits)
        _adam_flags(args)
    lr, why = (args.lr, None) if args.lr is not None else \
        default_lr(method, args.loss, splits.name)
    method_options = _method_options(args, method)
    if args.cs is not None:
        if method.name != "solve":
            raise ValueError(f"--cs: the solver's path of C; --mode {method.name} trains with "
                             f"Adam (give --solver lbfgs)")
        method_options["c"] = list(args.cs)
    config = TrainConfig(epochs=args.epochs or method.default_epochs,
                         batch_size=args.batch_size or method.default_batch_size, lr=lr,
                         seed=args.seed, early_stop=args.early_stop, device=device,
                         head_lr_mult=args.head_lr_mult, amp=args.amp,
                         num_workers=_workers(args, method), image_size=args.image_size,
                         metric=args.metric, drop_last=args.drop_last,
                         weight_decay=_train_weight_decay(args, method))
    if args.verbose and ctx.is_main:
        print(f"settings: --mode {method.name} --loss {args.loss} hparams {hparams or '{}'} "
              f"k {'train mean' if k is None else f'{k:g}'}; {config}; method options "
              f"{method_options or '{}'}; regime {args.regime}; out {args.out}", file=sys.stderr)
    bar, show = _epoch_bar(args, method.total_epochs(config, method_options) if ctx.is_main
                           else 0, f"{args.loss} {method.name} on {args.dataset}",
                           batches=images)
    try:
        with batch_progress(show.batch), acceleration(accel):
            res = train_run(method, splits, args.loss, hparams, config, k=k, out=args.out,
                            on_epoch=show, dataset_options=options, **method_options)
        if ctx.world_size > 1:  # every process done before any tears the group down (gloo
            torch.distributed.barrier()  # aborts on a destroy racing a peer's last collective)
    finally:
        bar.close()
        _end_processes(ctx)
    if why is not None and ctx.is_main and "lr" not in method.unused_train_fields:
        # (after the run, so an input error stays the one line)
        print(f"lr {lr:g}: {why} (--lr sets another)", file=sys.stderr)
    return _print_result(args, res) if ctx.is_main else 0


def _processes(method, args):
    """The torchrun context: a method that runs in many processes starts its process group;
    any other refuses to run under torchrun."""
    import os

    from ..distributed import current_context, init_distributed

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


def _end_processes(ctx) -> None:
    """Tear down a torchrun process group (`_processes`) at the end of the command."""
    if ctx.world_size > 1:
        import gc

        import torch

        torch.distributed.destroy_process_group()
        # free DDP's reducers and their finished gloo work now: left to interpreter shutdown,
        # freeing them can abort the process ("terminate called without an active
        # exception"; seen about once in 20 test-suite runs, after all work was done)
        gc.collect()


def _methods():
    from ..methods import list_methods

    return list_methods()


def _flag_options(args, method) -> dict:
    """Every method option a ``spml train`` flag gives (None: not given, the method's default
    stands). A method takes the ones it declares (``TrainingMethod.options``)."""
    return {"save_train_probs": args.save_train_probs or None,
            "head": getattr(args, "head", None), "hidden": getattr(args, "hidden", None),
            "backbone": args.backbone, "pretrained": False if args.random_init else None,
            "linear_epochs": args.linear_epochs, "linear_lr": args.linear_lr,
            "feature_dtype": args.feature_dtype, "cache_dir": args.cache_dir,
            "backbone_options": _weights_option(args, method),
            "progress": False if args.quiet else None,
            "augment": getattr(args, "augment", None),
            "weight_decay": getattr(args, "weight_decay", None),
            "warmup_epochs": getattr(args, "warmup_epochs", None),
            "lr_schedule": getattr(args, "lr_schedule", None),
            "cpu_bf16": getattr(args, "cpu_bf16", None)}


def _workers(args, method) -> int:
    """``--workers``, or for a method that loads images (``num_workers`` in its
    ``train_fields``) min(4, the CPU count); 0 for the others (a given ``--workers`` they do
    not use is refused with the run's other settings)."""
    import os

    if args.workers is not None:
        return args.workers
    return min(4, os.cpu_count() or 1) if "num_workers" in method.train_fields else 0


def _train_weight_decay(args, method) -> float:
    """``--weight-decay`` as ``TrainConfig.weight_decay`` (the heads on feature vectors: Adam's
    coupled L2); a method with a ``weight_decay`` option of its own (the fine-tuning modes' and
    LAC's decoupled decay) takes it there instead (`_method_options`)."""
    wd = getattr(args, "weight_decay", None)
    return 0.0 if wd is None or "weight_decay" in method.options else wd


#: ``spml train`` flags that are read into the data options (the feature modes' --backbone
#: features: spmlkit.loading.feature_options) or only change what is shown, not method options
_NOT_METHOD_OPTIONS = {"progress"}
_FEATURE_FLAGS = {"backbone", "feature_dtype", "cache_dir", "backbone_options"}
#: the flag of each method option _flag_options gives
_FLAG_OF = {"save_train_probs": "--save-train-probs", "head": "--head", "hidden": "--hidden",
            "backbone": "--backbone", "pretrained": "--random-init",
            "linear_epochs": "--linear-epochs", "linear_lr": "--linear-lr",
            "feature_dtype": "--float16", "cache_dir": "--cache-dir",
            "backbone_options": "--weights", "augment": "--augment",
            "weight_decay": "--weight-decay", "warmup_epochs": "--warmup-epochs",
            "lr_schedule": "--lr-schedule", "cpu_bf16": "--cpu-bf16"}


def _refuse_unused(flags: dict, method) -> None:
    """A flag given for a method option the ``--mode`` does not have is an error naming the
    modes that take it (never silently dropped); ``--weight-decay`` goes to TrainConfig for the
    modes that read ``TrainConfig.weight_decay``."""
    skip = set(_NOT_METHOD_OPTIONS)
    if method.inputs == "features":
        skip |= _FEATURE_FLAGS
    if "weight_decay" in method.train_fields:
        skip.add("weight_decay")
    for key, value in flags.items():
        if value is None or key in skip or key in method.options:
            continue
        if key == "feature_dtype" and value == "float32":  # the default of --float32/--float16
            continue
        users = [m.name for m in _methods() if key in m.options or (
            key in _FEATURE_FLAGS and m.inputs == "features") or (
            key == "weight_decay" and key in m.train_fields)]
        raise ValueError(f"{_FLAG_OF.get(key, key)}: --mode {method.name} does not use it; it "
                         f"is for --mode {', '.join(users)}")


def _weights_option(args, method) -> dict | None:
    """``backbone_options`` of ``--weights FILE`` (an absolute path), for the methods that
    build the backbone themselves (finetune, linear_init, lac, mime, boostlu); a method with a
    backbone of its own by default (its ``backbone`` option: lac, mime) needs no
    ``--backbone``."""
    if getattr(args, "weights", None) is None:
        return None
    from pathlib import Path

    if not args.backbone and method.options.get("backbone") is None:
        raise ValueError(f"--weights {args.weights}: weights are for a backbone; give "
                         f"--backbone NAME too (spml list backbones)")
    return {"weights": str(Path(args.weights).resolve())}


def _method_options(args, method) -> dict:
    flags = _flag_options(args, method)
    _refuse_unused(flags, method)
    if flags.get("hidden") is not None and "head" in method.options and \
            (flags.get("head") or method.options["head"]) != "mlp":
        raise ValueError(f"--hidden {flags['hidden']}: the width of the MLP head; this run's "
                         f"head is {flags.get('head') or method.options['head']}: give "
                         f"--head mlp too, or leave --hidden out")
    given = {k: v for k, v in flags.items() if v is not None and k in method.options}
    given.update(_pairs(getattr(args, "lac", None), "--lac"))  # deprecated: --option's
    given.update(_pairs(getattr(args, "option", None), "--option"))  # unknown keys: refused
    if method.inputs == "images" and "backbone" in method.options and not args.backbone and \
            method.options.get("backbone") is None and not method.accepts_vectors:
        raise ValueError(f"--mode {method.name} needs --backbone NAME (spml list backbones)")
    return given


#: the spml train flags a resume takes (where and how it runs and shows, not what it trains)
_RESUME_FLAGS = {"resume", "device", "cache_dir", "quiet", "verbose", "threads", "config",
                 "cudnn_benchmark", "compile", "gpu_decode", "jpeg_draft"}


def _refuse_resume_flags(args) -> None:
    """``--resume`` with a flag that would change the run (``--epochs``, ``--lr``, ...): an
    error naming them, not a resume that ignores them."""
    import argparse

    from . import build_parser

    train = next(a for a in build_parser()._actions
                 if isinstance(a, argparse._SubParsersAction)).choices["train"]
    defaults: dict = {}
    flags: dict = {}
    for action in train._actions:  # (a dest of two flags: --float32 / --float16)
        if action.option_strings:
            defaults.setdefault(action.dest, action.default)
            flags[action.dest] = "/".join(filter(None, [flags.get(action.dest),
                                                        action.option_strings[-1]]))
    given = [flags[d] for d, default in defaults.items()
             if d not in _RESUME_FLAGS and getattr(args, d, default) != default]
    if given:
        raise ValueError(f"{', '.join(given)}: --resume continues {args.resume} with the "
                         f"settings in its config.json, so these would be ignored; leave them "
                         f"out (a resume takes --device, --cache-dir, --quiet, --verbose, "
                         f"--threads and the speed-up flags), or train a new run")


def _resume_overrides(args, method) -> dict:
    """Options a resume may change: what is shown and where caches are, nothing that changes
    results."""
    flags = _flag_options(args, method)
    return {k: flags[k] for k in ("progress", "cache_dir") if k in method.options
            and flags[k] is not None}


def _epoch_bar(args, total, desc: str, batches: bool = False):
    """The run's progress bar and its ``on_epoch``. ``batches`` (the image modes): the bar
    counts training images, advanced after every batch, so it shows an ETA within an epoch;
    ``show.batch`` is the `spmlkit.engine.loop.batch_progress` reporter to install."""
    from tqdm import tqdm

    from ..metrics import METRICS

    bar = tqdm(total=total, desc=desc, unit="img" if batches else "epoch",
               disable=args.quiet or total == 0, unit_scale=False, smoothing=0.1)
    epochs = [0]

    def batch(rows, per_epoch):
        if bar.total == total and total:  # first batch: the bar's total in images
            bar.total = total * per_epoch
            bar.refresh()
        bar.update(rows)

    def show(rec, *_):
        shown = {key: rec[key] for key in ("phase", "stage") if key in rec}
        shown["loss"] = f"{rec['train_loss']:.4f}"
        if rec.get("val_map") is not None:
            shown["val_map"] = f"{rec['val_map']:.2f}"
        shown.update({f"val_{name}": f"{rec[f'val_{name}']:.4f}" for name in METRICS
                      if name != "map" and rec.get(f"val_{name}") is not None})  # --metric
        if "val_source" in rec:
            shown["by"] = rec["val_source"]
        epochs[0] += 1
        if batches:
            shown = {"epoch": f"{epochs[0]}/{total}", **shown}
        if getattr(args, "verbose", False):  # one line per epoch, kept above the bar
            bar.write(f"epoch {rec.get('epoch', epochs[0])}: "
                      + ", ".join(f"{key} {value}" for key, value in shown.items()
                                  if key != "epoch"), file=sys.stderr)
        if batches and epochs[0] == total:  # the bar is full; the scoring passes follow
            shown = {**shown, "now": "scoring the train, val and test images"}
        bar.set_postfix(shown)
        if not batches:
            bar.update()
    show.batch = batch if batches else None
    return bar, show


#: spml train's flags that set what Adam reads and the solver does not (flag -> given?)
_ADAM_FLAGS = {"--lr": lambda a: a.lr is not None, "--epochs": lambda a: a.epochs is not None,
               "--batch-size": lambda a: a.batch_size is not None,
               "--weight-decay": lambda a: a.weight_decay is not None,
               "--early-stop": lambda a: a.early_stop != "none",
               "--drop-last": lambda a: a.drop_last}


def _mode(args) -> str:
    """The run's training method: ``--mode``, or the one ``--solver`` names (``lbfgs``: the
    head solved along the C path, mode ``solve``; ``adam``: trained, mode ``linear``), or by
    default ``solve`` on your own data (the tabular / arrays / csv / folder sources, or
    ``--data train_labels=observed``) and ``linear`` on the built-in sets (the papers'
    protocol). On your own data without ``--solver``, Adam's flags are refused naming
    ``--solver adam``, never read as a switch."""
    from ..experiments.benchmark import own_data

    if args.solver is not None and args.mode is not None:
        raise ValueError(f"--solver {args.solver} names the training method (--mode "
                         f"{'solve' if args.solver == 'lbfgs' else 'linear'}); --mode "
                         f"{args.mode} names one too: give one of them")
    if args.solver is not None:
        return "solve" if args.solver == "lbfgs" else "linear"
    if args.mode is not None:
        return args.mode
    observed = any(str(item).replace(" ", "") == "train_labels=observed"
                   for item in (args.data or []))  # (read, not checked: the data comes later)
    if not own_data(args.dataset or "yeast", {"train_labels": "observed"} if observed else {}):
        return "linear"
    args.solver_by_default = True  # Adam's flags refused once the data is read (_adam_flags)
    return "solve"


def _adam_flags(args) -> None:
    """On your own data without ``--solver`` (the solver by default), Adam's flags refused,
    naming ``--solver adam``: after the data is read, so that an error in the data comes
    first."""
    if not getattr(args, "solver_by_default", False):
        return
    given = [flag for flag, test in _ADAM_FLAGS.items() if test(args)]
    if given:
        raise ValueError(f"{', '.join(given)}: on your own data spml train solves the head by "
                         f"default (--solver lbfgs: the loss at its L2-regularised optimum, C "
                         f"picked on val along --cs), which does not use "
                         f"{'them' if len(given) > 1 else 'it'}; give --solver adam to train "
                         f"with Adam")


def _print_result(args, res: dict) -> int:
    where = ", ".join(str(v) for v in (res.get("regime"), res.get("backbone")) if v)
    best = f"best epoch {res['best_epoch']}"
    if res.get("C") is not None:  # a solve: the path's selected value
        solver = res.get("solver") or {}
        best = (f"C {res['C']:g} (value {res['best_epoch']} of the path, {solver.get('solves')} "
                f"solve(s), {solver.get('iterations')} L-BFGS iterations, form "
                f"{solver.get('form')}"
                + ("" if solver.get("converged", True) else ", some short of the tolerance")
                + ")")
    if "best_stage" in res:
        best += f" (stage {res['best_stage']}, {res['best_source']})"
    recovery = res.get("train_recovery_map")
    recovery = "n/a (partial training labels)" if recovery is None else f"{recovery:.2f}"
    if res.get("labels"):
        print(f"labels: {res['labels']}")
    print(f"{res['loss']} {res.get('mode', 'linear')} ({where}): {best}, val mAP "
          f"{res['val_map']:.2f}, test mAP {res['test_map']:.2f}, train recovery mAP "
          f"{recovery}  [{res['seconds']:.1f} s]")
    left = res.get("test_map_left_out")
    if left:
        print(f"test mAP: the mean over the classes with a positive in the test set; "
              f"{len(left)} class(es) have none and are left out: {', '.join(left[:8])}"
              f"{', ...' if len(left) > 8 else ''}", file=sys.stderr)
    test = res.get("test_metrics")
    if test:
        from ..metrics import METRICS

        on = res.get("metric", "map")
        if on != "map":
            print(f"selected on val {on}: {res['val_score']:.{METRICS[on].decimals}f}")
        at = "" if test.get("threshold") is None else \
            f" (F1 and Hamming at threshold={test['threshold']:.4g}: chosen on val, max val " \
            f"micro-F1, the one spml predict applies by default)"
        print("test: " + ", ".join(f"{name} {test[name]:.{METRICS[name].decimals}f}"
                                   for name in METRICS if name != "map"
                                   and test.get(name) is not None) + at)
    paper = res.get("test_metrics_at_paper_threshold")
    if paper:
        from ..metrics import METRICS

        print(f"test at the paper's threshold {paper['threshold']:g}: " + ", ".join(
            f"{name} {value:.{METRICS[name].decimals}f}" for name, value in paper.items()
            if name != "threshold" and value is not None))
    if res.get("skipped_images"):
        where = f" (listed in {res['run_dir']}/skipped_images.json)" if res.get("run_dir") \
            else ""
        print(f"skipped {res['skipped_images']} unreadable or missing image(s){where}",
              file=sys.stderr)
    if res.get("run_dir"):
        print(f"run folder: {res['run_dir']}")
    for warning in res.get("warnings") or []:
        print(f"warning: {warning}", file=sys.stderr)
    return 0


def _add_finetune(method, training, finetune) -> None:
    """``spml train``'s method, resume, device and fine-tuning options, into their groups."""
    from ..engine import FinetuneOptions, TrainConfig

    method.add_argument("--mode", default=None, metavar="METHOD",
                        help=LazyHelp(_methods_help))
    add_solver(method, lbfgs="a head on feature vectors solved to a tolerance along the C "
               "path (--mode solve)", adam="the head trained for --epochs (--mode linear)")
    method.add_argument("--option", action="append", metavar="KEY=VALUE",
                        help="any option of the --mode's method (spml list methods), e.g. --mode "
                             "smile --option p=0.1 --option bias=true (repeatable)")
    method.add_argument("--lac", action="append", metavar="KEY=VALUE",
                        help="deprecated: the same as --option KEY=VALUE (LAC's options are "
                             "flat, as every method's: --mode lac --option dim=64)")
    training.add_argument("--resume", default=None, metavar="RUN_DIR",
                          help="continue an interrupted run (any --mode) from its checkpoint, with "
                               "the settings in its config.json (--device, --cache-dir, --quiet, "
                               "--verbose, --threads and the speed-up flags may change; the "
                               "options that would change the run, --epochs too, are refused: "
                               "train a new run for more epochs)")
    field_option(finetune, "--head-lr-mult", TrainConfig, default=1.0,
                          help="fine-tuning: the head's learning rate is lr times this (Kim et "
                               "al.: 10)")
    field_option(finetune, "--amp", TrainConfig, default="auto",
                          help="fine-tuning on CUDA: autocast dtype (auto: bf16 where supported); "
                               "the loss is always float32")
    field_option(finetune, "--workers", TrainConfig, "num_workers", default=None,
                          help="the image modes: image-loading processes per training process "
                               "(default min(4, CPUs); refused by the feature modes)")
    field_option(finetune, "--image-size", TrainConfig, default=None,
                          help="fine-tuning: input side (default: the backbone's)")
    training.add_argument("--device", type=_device, default=None,
                          help="fine-tuning: cpu or cuda (default: cuda if there; with torchrun "
                               "each process takes cuda:LOCAL_RANK)")
    finetune.add_argument("--random-init", action="store_true",
                          help="fine-tuning: start the backbone from random weights (the "
                               "same ones in every run: drawn from a fixed seed, not --seed)")
    finetune.add_argument("--augment", choices=["none", "weak", "strong"], default=None,
                          help="fine-tuning: training-image augmentation: none (resize only), weak "
                               "(default: resize + horizontal flip) or strong (flip, Cutout, "
                               "RandAugment 2 ops at 9, colour jitter, grayscale)")
    field_option(training, "--weight-decay", TrainConfig, default=None, metavar="WD",
                          help="L2 on the weights, not biases (default 0; LAC: its 0.01): the "
                               "heads on feature vectors (linear, --head mlp, smile's "
                               "classifier) as Adam's coupled L2, as their Adam has it; "
                               "finetune / linear_init / lac decoupled (AdamW-style), as their "
                               "optimisers have it (linear_init's linear phase: coupled, as "
                               "the linear mode); refused by the other modes")
    field_option(finetune, "--warmup-epochs", FinetuneOptions, default=None, metavar="E",
                          help="fine-tuning: linear learning-rate warm-up over E epochs, moved "
                               "every batch (default 0)")
    field_option(finetune, "--lr-schedule", FinetuneOptions, "schedule", default=None,
                          help="fine-tuning: the learning rate after the warm-up (default "
                               "constant)")
    finetune.add_argument("--cpu-bf16", action="store_true", default=None,
                          help="fine-tuning on a CPU: bfloat16 autocast of the training forward "
                               "(faster only on CPUs with native bf16: AVX-512-BF16 / AMX)")
    add_acceleration(finetune)
    field_option(finetune, "--linear-epochs", TrainConfig, "epochs", default=None,
                          help="linear_init: epochs of the linear phase (default 25)")
    field_option(finetune, "--linear-lr", TrainConfig, "lr", default=None,
                          help="linear_init: learning rate of the linear phase (default --lr)")


def register(sub) -> None:
    """Add the command's parser to ``sub`` (``spml``'s subparsers)."""
    from ..engine import TrainConfig

    p = sub.add_parser("train", help="train one method, print val/test mAP, write a run folder")
    data = p.add_argument_group("data", "which dataset, which labels, which features")
    method = p.add_argument_group("method", "what trains: the training method and its loss")
    training = p.add_argument_group("training")
    finetune = p.add_argument_group("fine-tuning", "the methods that train the backbone end "
                                    "to end on images")
    output = p.add_argument_group("output")
    add_data(data, regime="the run's label regime")
    add_training(training)
    method.add_argument("--loss", default="an", help=LazyHelp(_losses_help))
    method.add_argument("--hp", action="append", metavar="KEY=VALUE",
                        help="loss hyperparameter, e.g. --hp lam=2 (repeatable)")
    method.add_argument("--reg", action="append", metavar="NAME:WEIGHT",
                        help="add a regulariser to the loss, e.g. --reg highrank:1e-3")
    field_option(training, "--batch-size", TrainConfig, default=None,
                          help="default 8 (Cole et al.'s linear and fine-tuned runs); 32 with "
                               "--mode lac (Xie et al.)")
    field_option(training, "--lr", TrainConfig, default=None,
                          help="learning rate (default: the value the paper selected for the loss "
                               "where known, else the method's default: 1e-3 for a linear head, "
                               "1e-4 fine-tuned; the value used and why are printed)")
    field_option(training, "--seed", TrainConfig, default=0,
                          help="the run's seed: the initialisation and the batch order "
                               "(default: 0); the observed labels are drawn with seed 1200, the "
                               "same for every run, as in the papers (--data seed=N draws "
                               "others)")
    method.add_argument("--k", type=_positive, default=None,
                        help="expected positives per example (default: the mean per row of the "
                             "train split's full labels; of the val labels when the training "
                             "labels are your own observed ones, --regime given)")
    method.add_argument("--k-estimate", type=_whole(1), default=None, metavar="M",
                        help="estimate k from M fully labelled train rows (Cole et al. App. B; val "
                             "rows with --regime given)")
    add_output(output, out="runs", out_help="parent folder of the run folder",
               verbose="print the resolved settings before the run and one line per epoch "
                       "(train loss, val metrics)")
    p.add_argument("--config", default=None, metavar="FILE",
                   help="read options from a YAML or JSON file: a mapping of long option names "
                        "without -- (batch_size: 16, hp: {lam: 2}, data: {path: t.csv}, "
                        "quiet: true); flags on the command line override it; an unknown key "
                        "is an error")
    output.add_argument("--save-train-probs", action="store_true",
                        help="store the train probabilities after every epoch (train_probs.npy, "
                             "float16) for `spml analyze histograms`")
    method.add_argument("--head", choices=["linear", "mlp"], default=None,
                        help="linear mode: the head on the features, linear (default) or mlp (one "
                             "hidden ReLU layer, the tabular SPML protocol's MLP)")
    method.add_argument("--hidden", type=_whole(1), default=None,
                        help="--head mlp: hidden units (default 256); --mode smile: its "
                             "networks' width (default: the number of labels)")
    add_backbone(data)
    _add_finetune(method, training, finetune)
    p.set_defaults(func=cmd_train)


def parse_with_config(argv: list, path: str):
    """``spml train ... --config FILE``: the file's options become the train parser's
    defaults, so flags given on the command line override them; returns the parsed args.

    Raises:
        ValueError: the file is not a mapping, names an option spml train does not have
            (with the closest one), or gives a value of the wrong kind (naming the key).
        FileNotFoundError: no such file.
    """
    import argparse

    from ..experiments.study.yaml_text import parse_yaml
    from . import build_parser

    parser = build_parser()
    train = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)) \
        .choices["train"]
    where = f"--config {path}"
    try:  # YAML, and JSON (a subset of YAML); aliases that multiply it are refused
        with open(path, encoding="utf-8") as f:
            raw = parse_yaml(f.read(), where, "a spml train config")
    except UnicodeDecodeError as err:
        raise ValueError(f"{where}: not a text file ({err.reason} at byte {err.start})") \
            from None
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: must hold a mapping of spml train options (e.g. "
                         f"'loss: role'), got {type(raw).__name__}")
    actions = {a.dest: a for a in train._actions
               if a.option_strings and a.dest not in ("help", "config")}
    train.set_defaults(**{dest: _config_value(where, key, value, actions[dest])
                          for key, value in raw.items()
                          for dest in [_config_dest(where, key, actions)]})
    args = parser.parse_args(argv)
    if args.quiet and args.verbose:  # the command line's choice overrides the file's
        if "--quiet" in argv or "--verbose" in argv:
            args.verbose = args.verbose and "--verbose" in argv
            args.quiet = not args.verbose
        else:
            raise ValueError(f"{where}: quiet and verbose exclude each other")
    return args


def _config_dest(where: str, key, actions: dict) -> str:
    import difflib

    dest = str(key).lstrip("-").replace("-", "_")
    if dest not in actions:
        close = difflib.get_close_matches(dest, list(actions), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"{where}: unknown option {key!r} for spml train{hint} (the keys are "
                         f"spml train --help's long options without --, e.g. batch_size)")
    return dest


def _config_value(where: str, key, value, action):
    """A file's value as the flag would have given it: the flag's type and choices applied
    (scalars), true / false for switches, ``KEY=VALUE`` strings for the repeatable options."""
    import argparse

    what = f"{where}: {key}"
    if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
        if not isinstance(value, bool):
            raise ValueError(f"{what}: a switch, give true or false, got {value!r}")
        return value if isinstance(action, argparse._StoreTrueAction) else not value
    if isinstance(action, argparse._AppendAction):
        # KEY=VALUE (--hp, --data, ...) or NAME:WEIGHT (--reg): a mapping, or items written
        # as the flag takes them; anything else would be reported later as a flag never typed
        sep = ":" if action.metavar == "NAME:WEIGHT" else "="
        items = value if isinstance(value, list) else [value]
        out = []
        for item in items:
            if isinstance(item, dict):
                out += [f"{k}{sep}{_flag_text(v)}" for k, v in item.items()]
            elif isinstance(item, str) and sep in item:
                out.append(item)
            else:
                example = "{reg_name: 0.1}" if sep == ":" else "{name: value}"
                raise ValueError(f"{what}: a mapping, e.g. '{key}: {example}' (or a list of "
                                 f"{action.metavar} strings), got {value!r}")
        return out
    if isinstance(value, (dict, list)):
        raise ValueError(f"{what}: one value, got {value!r}")
    try:
        converted = action.type(_flag_text(value)) if action.type else _flag_text(value)
    except (TypeError, ValueError, argparse.ArgumentTypeError) as err:
        raise ValueError(f"{what}: {err}") from None
    if action.choices is not None and converted not in action.choices:
        raise ValueError(f"{what}: {value!r} is not one of {', '.join(map(str, action.choices))}")
    return converted


def _flag_text(value) -> str:
    """How ``value`` is written on the command line (YAML's true -> true)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return ",".join(map(str, value))
    return str(value)
