"""``spml train``: one run of any registered training method, or a resumed one."""
from __future__ import annotations

import sys

from .common import (
    LazyHelp, _losses_help, _methods_help, _regimes_help,
    _pairs, _data, _dataset, _describe_features, _whole, _positive, _nonnegative, _device, SEED,
    _add_common, _add_backbone, _feature_data)


def cmd_train(args) -> int:
    """``spml train``: one run of any registered method (``--mode``), or ``--resume RUN_DIR``."""
    import torch

    from ..features import load_splits
    from ..engine import TrainConfig
    from ..engine.loop import batch_progress
    from ..methods import default_lr, get_method, resolve_k, resume_run, train_run

    if args.resume:
        from ..runs import read_run

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
                         metric=args.metric, drop_last=args.drop_last)
    method_options = _method_options(args, method)
    bar, show = _epoch_bar(args, method.total_epochs(config, method_options) if ctx.is_main
                           else 0, f"{args.loss} {method.name} on {args.dataset}",
                           batches=images)
    try:
        with batch_progress(show.batch):
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
    given = {k: v for k, v in _flag_options(args, method).items()
             if v is not None and k in method.options}
    given.update(_pairs(getattr(args, "lac", None), "--lac"))  # deprecated: --option's
    given.update(_pairs(getattr(args, "option", None), "--option"))  # unknown keys: refused
    if method.inputs == "images" and "backbone" in method.options and not args.backbone and \
            method.options.get("backbone") is None and not method.accepts_vectors:
        raise ValueError(f"--mode {method.name} needs --backbone NAME (spml list backbones)")
    return given


def _resume_overrides(args, method) -> dict:
    """Options a resume may change: what is shown and where caches are, nothing that changes
    results."""
    flags = _flag_options(args, method)
    return {k: flags[k] for k in ("progress", "cache_dir") if k in method.options
            and flags[k] is not None}


def _epoch_bar(args, total, desc: str, batches: bool = False):
    """The run's progress bar and its ``on_epoch``. ``batches`` (the image modes): the bar
    counts training images, advanced after every batch, so it shows an ETA within an epoch;
    ``show.batch`` is the :func:`spmlkit.engine.loop.batch_progress` reporter to install."""
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
        bar.set_postfix(shown)
        if not batches:
            bar.update()
    show.batch = batch if batches else None
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
    import os

    method.add_argument("--mode", default="linear", metavar="METHOD",
                        help=LazyHelp(_methods_help))
    method.add_argument("--option", action="append", metavar="KEY=VALUE",
                        help="any option of the --mode's method (spml list methods), e.g. --mode "
                             "smile --option p=0.1 --option bias=true (repeatable)")
    method.add_argument("--lac", action="append", metavar="KEY=VALUE",
                        help="deprecated: the same as --option KEY=VALUE (LAC's options are "
                             "flat, as every method's: --mode lac --option dim=64)")
    training.add_argument("--resume", default=None, metavar="RUN_DIR",
                          help="continue an interrupted run (any --mode) from its checkpoint, with "
                               "the settings in its config.json (--device, --cache-dir and --quiet "
                               "may change; the other options are ignored)")
    finetune.add_argument("--head-lr-mult", type=_positive, default=1.0,
                          help="fine-tuning: the head's learning rate is lr times this (Kim et "
                               "al.: 10)")
    finetune.add_argument("--amp", choices=["auto", "none", "bf16", "fp16"], default="auto",
                          help="fine-tuning on CUDA: autocast dtype (auto: bf16 where supported); "
                               "the loss is always float32")
    finetune.add_argument("--workers", type=_whole(0), default=min(4, os.cpu_count() or 1),
                          help="fine-tuning: image-loading processes per training process")
    finetune.add_argument("--image-size", type=_whole(1), default=None,
                          help="fine-tuning: input side (default: the backbone's)")
    training.add_argument("--device", type=_device, default=None,
                          help="fine-tuning: cpu or cuda (default: cuda if there; with torchrun "
                               "each process takes cuda:LOCAL_RANK)")
    finetune.add_argument("--random-init", action="store_true",
                          help="fine-tuning: start the backbone from random weights")
    finetune.add_argument("--augment", choices=["none", "weak", "strong"], default=None,
                          help="fine-tuning: training-image augmentation: none (resize only), weak "
                               "(default: resize + horizontal flip) or strong (flip, Cutout, "
                               "RandAugment 2 ops at 9, colour jitter, grayscale)")
    finetune.add_argument("--weight-decay", type=_nonnegative, default=None, metavar="WD",
                          help="fine-tuning: decoupled (AdamW-style) weight decay on weights, not "
                               "biases or norms (default 0)")
    finetune.add_argument("--warmup-epochs", type=_nonnegative, default=None, metavar="E",
                          help="fine-tuning: linear learning-rate warm-up over E epochs, moved "
                               "every batch (default 0)")
    finetune.add_argument("--lr-schedule", choices=["constant", "cosine"], default=None,
                          help="fine-tuning: the learning rate after the warm-up (default "
                               "constant)")
    finetune.add_argument("--cpu-bf16", action="store_true", default=None,
                          help="fine-tuning on a CPU: bfloat16 autocast of the training forward "
                               "(faster only on CPUs with native bf16: AVX-512-BF16 / AMX)")
    finetune.add_argument("--linear-epochs", type=_whole(1), default=None,
                          help="linear_init: epochs of the linear phase (default 25)")
    finetune.add_argument("--linear-lr", type=_positive, default=None,
                          help="linear_init: learning rate of the linear phase (default --lr)")


def register(sub) -> None:
    """Add the command's parser to ``sub`` (``spml``'s subparsers)."""
    p = sub.add_parser("train", help="train one method, print val/test mAP, write a run folder")
    data = p.add_argument_group("data", "which dataset, which labels, which features")
    method = p.add_argument_group("method", "what trains: the training method and its loss")
    training = p.add_argument_group("training")
    finetune = p.add_argument_group("fine-tuning", "the methods that train the backbone end "
                                    "to end on images")
    output = p.add_argument_group("output")
    _add_common(p, data, training)
    method.add_argument("--loss", default="an", help=LazyHelp(_losses_help))
    data.add_argument("--regime", default=None, help=LazyHelp(_regimes_help))
    method.add_argument("--hp", action="append", metavar="KEY=VALUE",
                        help="loss hyperparameter, e.g. --hp lam=2 (repeatable)")
    method.add_argument("--reg", action="append", metavar="NAME:WEIGHT",
                        help="add a regulariser to the loss, e.g. --reg highrank:1e-3")
    training.add_argument("--batch-size", type=_whole(1), default=None,
                          help="default 8 (Cole et al.'s linear and fine-tuned runs); 32 with "
                               "--mode lac (Xie et al.)")
    training.add_argument("--lr", type=_positive, default=None,
                          help="learning rate (default: the value the paper selected for the loss "
                               "where known, else the method's default: 1e-3 for a linear head, "
                               "1e-4 fine-tuned; the value used and why are printed)")
    training.add_argument("--seed", type=SEED, default=0)
    method.add_argument("--k", type=_positive, default=None,
                        help="expected positives per example (default: the train split's mean)")
    method.add_argument("--k-estimate", type=_whole(1), default=None, metavar="M",
                        help="estimate k from M fully labelled train rows (Cole et al. App. B; val "
                             "rows with --regime given)")
    output.add_argument("--out", default="runs", help="parent folder of the run folder")
    output.add_argument("--quiet", action="store_true", help="no progress bar")
    output.add_argument("--save-train-probs", action="store_true",
                        help="store the train probabilities after every epoch (train_probs.npy, "
                             "float16) for `spml analyze histograms`")
    method.add_argument("--head", choices=["linear", "mlp"], default=None,
                        help="linear mode: the head on the features, linear (default) or mlp (one "
                             "hidden ReLU layer, the tabular SPML protocol's MLP)")
    method.add_argument("--hidden", type=_whole(1), default=None,
                        help="--head mlp: hidden units (default 256)")
    _add_backbone(p, group=data)
    _add_finetune(method, training, finetune)
    p.set_defaults(func=cmd_train)
