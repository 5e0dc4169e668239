"""The option groups the ``spml`` commands share, each written once: a command's ``register``
adds these to its parser (into its own argument groups), then the options that are its alone.

- `add_data`: ``--dataset``, ``--data`` and, for the commands that draw observed labels,
  ``--regime``;
- `add_training`: the epochs, early stopping, the selection metric, ``--drop-last``,
  ``--threads`` (spml train, spml benchmark);
- `add_solver`: ``--solver`` and its C path ``--cs`` (spml train, spml benchmark);
- `add_pool`: the worker processes, ``--jobs`` and ``--no-vectorise`` (spml benchmark,
  spml study run);
- `add_loading`: how inputs are loaded and run, ``--batch-size``, ``--workers``,
  ``--device`` (spml extract, spml predict);
- `add_output`: the output folder and the progress bar, ``--out``, ``--quiet`` (and
  ``--verbose``);
- `add_output_file`: one output file and ``--force`` (predict, analyze, figure, report,
  study export);
- `add_backbone`, `add_acceleration`: a backbone's cached features, the image paths'
  speed-ups.
"""
from __future__ import annotations

from ..constraints import Interval, Options, alternatives, describe, option_type
from .common import FORCE_HELP, MAX_THREADS, LazyHelp, _device, _floats, _join, _whole

#: where spml train and spml benchmark take the solver by default
SOLVER_DEFAULT = ("Default: lbfgs on your own data (--data train_labels=observed, or the "
                  "tabular / arrays / csv / folder sources), adam on the built-in sets (the "
                  "papers' protocol)")


def _datasets_help() -> str:
    from ..data import DATASETS

    return (f"registered dataset: {_join(DATASETS.names())} (spml list datasets); default "
            "yeast, and required with a source's --data options (e.g. --dataset tabular for "
            "your own CSV / Parquet table)")


def _regimes_help(whose: str) -> str:
    from ..labels import REGIMES

    return (f"{whose}: " + " | ".join(REGIMES) + " (spml list regimes; given: your own "
            "observed training labels). Default 1p; given, and only given, when --data "
            "train_labels=observed says the data's training labels are the observed ones "
            "(1 / 0 / -1 or empty cells)")


def _metric_help() -> str:
    from ..metrics import METRICS

    def names(up):
        return _join(f"{n} (default)" if n == "map" else n
                     for n, m in METRICS.items() if m.higher_is_better == up)
    return ("the val metric the best epoch (and grid point) is selected on: "
            f"{names(True)} (higher is better) or {names(False)} (lower is better)")


def _threads_help() -> str:
    from ..methods import list_methods

    images = " / ".join(m.name for m in list_methods() if m.inputs == "images")
    return ("torch threads per process (default: 1 for the feature modes, where a linear head "
            "on small batches is bound by per-operation overhead and extra threads only add "
            f"contention; the machine's cores for the image modes --mode {images}, whose "
            "convolutions use them)")


def _backbone_help(default: str | None) -> str:
    from ..models.backbones import list_backbones

    names = _join(name for name, _ in list_backbones())
    if default is None:
        return ("image sources: train on this backbone's cached features, extracted first if "
                f"missing: {names} (spml list backbones)")
    return f"backbone: {names} (spml list backbones; timm:<model> with timm installed)"


def field_option(group, flag: str, record, field: str | None = None, *, help, **kwargs):
    """An option that sets ``record``'s ``field`` (default: the flag's name), read by the
    field's rule in the record's table (`spmlkit.constraints`): its ``choices`` (`Options`) or
    its ``type`` (the text parsed and checked as the record checks it); a number's help ends
    with what its rule accepts."""
    field = field or flag.lstrip("-").replace("-", "_")
    rule = record.parameter_constraints[field]
    given = [r for r in alternatives(rule) if r is not None]  # (None is no text)
    if isinstance(given[0], Options):
        kwargs["choices"] = list(given[0].values)
    else:
        kwargs["type"] = option_type(given, flag, field)
    if isinstance(given[0], Interval) and isinstance(help, str):
        help = f"{help}; {describe(given)}"
    action = group.add_argument(flag, help=help, **kwargs)
    action.sets_field = (record, field)  # (tests/test_constraints.py reads it)
    return action


def add_data(group, *, regime: str | None = None, image_source: bool = False) -> None:
    """``--dataset`` and ``--data`` into ``group``; ``--regime`` too when ``regime`` says
    whose regime it is. ``image_source``: the dataset is a required image source (spml
    extract)."""
    if image_source:
        group.add_argument("--dataset", required=True, help="registered image source")
    else:
        group.add_argument("--dataset", default=None, help=LazyHelp(_datasets_help))
    group.add_argument("--data", action="append", metavar="KEY=VALUE",
                       help="dataset option, e.g. --data root=/data/pascal (repeatable; a "
                            "source's options: spml list datasets NAME --details)")
    if regime is not None:
        group.add_argument("--regime", default=None,
                           help=LazyHelp(lambda: _regimes_help(regime)))


def add_training(group) -> None:
    """The epochs, early stopping, the selection metric (`spmlkit.engine.TrainConfig`'s
    rules), ``--drop-last`` and ``--threads``."""
    from ..engine.config import TrainConfig

    field_option(group, "--epochs", TrainConfig, default=None,
                 help="default 25 (spml train: the method's, e.g. 40 for --mode lac)")
    field_option(group, "--early-stop", TrainConfig, default="none",
                 help="none | patience:N | drop:X (default none: fixed epochs, Cole et al.)")
    field_option(group, "--metric", TrainConfig, default="map", help=LazyHelp(_metric_help))
    group.add_argument("--drop-last", action="store_true",
                       help="train without each epoch's last, shorter batch, as Cole et al.'s "
                            "and Xie et al.'s loaders (drop_last=True); default: every row "
                            "trains. Validation and test always score every row (a subset that "
                            "depends on the batch size would make grid points incomparable)")
    group.add_argument("--threads", type=_whole(1, MAX_THREADS), default=None,
                       help=LazyHelp(_threads_help))


def add_solver(group, *, lbfgs: str, adam: str) -> None:
    """``--solver`` (``lbfgs`` and ``adam`` say what each does for the command) and the C
    path of lbfgs, ``--cs``."""
    group.add_argument("--solver", choices=("lbfgs", "adam"), default=None,
                       help=f"lbfgs: {lbfgs}; adam: {adam}. {SOLVER_DEFAULT}")
    group.add_argument("--cs", type=_floats, default=None,
                       help="--solver lbfgs: the path of C, scikit-learn's inverse L2 strength "
                            "(default 10^-4 .. 10^4 in half decades, 17 values; one value: no "
                            "path)")


def add_pool(group, *, jobs: str = "worker processes") -> None:
    """``--jobs`` (``jobs``: what the processes are) and ``--no-vectorise``."""
    group.add_argument("--jobs", type=int, default=None, help=f"{jobs} (default: cores)")
    group.add_argument("--no-vectorise", action="store_true",
                       help="train every grid point alone (default: the linear mode trains the "
                            "runs that differ only in seed, learning rate and weight decay "
                            "together, as one stacked model; same results up to float summation "
                            "order)")


def add_loading(group, *, batch_size: int, workers: int | None, workers_default: str,
                device: str | None) -> None:
    """``--batch-size`` (its default ``batch_size``), ``--workers`` (default ``workers``,
    described as ``workers_default``) and ``--device`` (default ``device``; None: cuda if
    there)."""
    group.add_argument("--batch-size", type=_whole(1), default=batch_size,
                       help="inputs per forward pass (default: %(default)s)")
    group.add_argument("--workers", type=_whole(0), default=workers,
                       help=f"image-loading processes (default: {workers_default})")
    group.add_argument("--device", type=_device, default=device,
                       help=f"cpu, cuda or cuda:1 (default: {device or 'cuda if there'})")


def add_output(group, *, out: str | None = None, out_help: str | None = None,
               verbose: str | None = None) -> None:
    """``--out`` (default ``out``, described by ``out_help``; none when ``out_help`` is None)
    and ``--quiet``; with ``verbose`` (what it prints), ``--verbose``, exclusive with it."""
    if out_help is not None:
        group.add_argument("--out", default=out, help=out_help)
    shown = group.add_mutually_exclusive_group() if verbose else group
    shown.add_argument("--quiet", action="store_true", help="no progress bar")
    if verbose:
        shown.add_argument("--verbose", action="store_true", help=verbose)


def add_output_file(group, *, what: str, required: bool = False, flag: str = "--out") -> None:
    """``flag`` (``--out``), the output file described as ``what``, and ``--force``."""
    group.add_argument(flag, required=required, default=None, metavar="FILE", help=what)
    group.add_argument("--force", action="store_true", help=FORCE_HELP)


def add_backbone(group, default: str | None = None) -> None:
    """``--backbone``, ``--float32`` / ``--float16``, ``--cache-dir`` and ``--weights``."""
    group.add_argument("--backbone", default=default,
                       help=LazyHelp(lambda: _backbone_help(default)))
    g = group.add_mutually_exclusive_group()
    g.add_argument("--float32", dest="feature_dtype", action="store_const", const="float32",
                   default="float32", help="store features as float32 (default)")
    g.add_argument("--float16", dest="feature_dtype", action="store_const", const="float16",
                   help="store features as float16 (half the disk and memory)")
    group.add_argument("--cache-dir", default=None,
                       help="feature stores folder (default $SPMLKIT_CACHE/features or "
                            "~/.cache/spmlkit/features)")
    group.add_argument("--weights", default=None, metavar="FILE",
                       help="your own weights for --backbone instead of its pretrained ones: a "
                            "state dict of that architecture (saved by spmlkit, torchvision or "
                            "timm; module. / model. prefixes and the ImageNet classifier are "
                            "handled; keys that do not match are named)")


def add_acceleration(group) -> None:
    """``--cudnn-benchmark``, ``--compile [MODE]``, ``--gpu-decode``, ``--jpeg-draft``: the
    opt-in speed-ups of the image paths (`spmlkit.accel`), each changing bits."""
    group.add_argument("--cudnn-benchmark", action="store_true",
                       help="CUDA: cudnn's autotuner (seconds at the start and at each new "
                            "input shape; results no longer bit-reproducible)")
    group.add_argument("--compile", nargs="?", const="default", default=None, metavar="MODE",
                       choices=["default", "reduce-overhead", "max-autotune"],
                       help="run the model through torch.compile (MODE: default, "
                            "reduce-overhead = CUDA graphs for small batches, max-autotune); "
                            "costs a compilation of tens of seconds or more at the start and "
                            "per new batch shape")
    group.add_argument("--gpu-decode", action="store_true",
                       help="decode JPEGs on the GPU (torchvision's nvJPEG) and resize there "
                            "(antialiased bilinear: pixels differ a little from PIL's); eval "
                            "and weak views only; needs CUDA and torchvision; decodes on a CUDA "
                            "stream of its own (docs/guide/images.md)")
    group.add_argument("--jpeg-draft", action="store_true",
                       help="decode JPEGs at a reduced scale (1/2, 1/4, 1/8) no smaller than "
                            "the view, then resize as before: several times faster for photos "
                            "much larger than the view; pixels differ by a fraction of a level")
