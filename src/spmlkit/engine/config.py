"""A run's hyperparameters ([`TrainConfig`][spmlkit.engine.config.TrainConfig]) and the
early-stopping rules."""
from __future__ import annotations

import contextlib
from dataclasses import asdict, dataclass
from typing import ClassVar

from ..constraints import Boolean, Interval, Options, Rule, check_record

AMP_MODES = ("auto", "none", "bf16", "fp16")
#: the mAP conventions (`spmlkit.metrics.mean_average_precision`)
MAP_CONVENTIONS = ("present", "official")


#: the most epochs a run may ask for (a bound on a typo such as ``epochs: 10**12``)
MAX_EPOCHS = 100_000
#: seeds are numpy's (``RandomState`` takes them in [0, 2**32))
MAX_SEED = 2**32 - 1


def check_device(text) -> str:
    """``text`` if it names a torch device this machine has (``cpu``, ``cuda``, ``cuda:1``,
    ``mps``), else a ``ValueError`` saying what it has: ``cuda`` on a machine without CUDA
    ended deep in a run as torch's ``AssertionError: Torch not compiled with CUDA enabled``."""
    import torch

    try:
        dev = torch.device(text)
    except (RuntimeError, ValueError, TypeError):
        raise ValueError(f"expected a device such as cpu, cuda or cuda:1, got {text!r}") from None
    if dev.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if not count or (dev.index is not None and dev.index >= count):
            raise ValueError(f"{text!r}: this machine has {count} CUDA device(s)"
                             + ("" if count else "; use cpu"))
    elif dev.type == "mps" and not (getattr(torch.backends, "mps", None)
                                    and torch.backends.mps.is_available()):
        raise ValueError(f"{text!r}: this machine has no MPS device; use cpu")
    return text


def _device_name(text) -> str:
    """``text`` if torch reads it as a device (``cpu``, ``cuda:1``; whether this machine has it
    is `check_device`'s: a study's workers may run elsewhere)."""
    import torch

    if not isinstance(text, str):
        raise ValueError(f"device must be a name such as cpu or cuda:1, got {text!r}")
    try:
        torch.device(text)
    except (RuntimeError, ValueError):
        raise ValueError(f"device must be a name such as cpu, cuda or cuda:1, got "
                         f"{text!r}") from None
    return text


def _metric_name(name) -> str:
    from ..metrics import check_metric

    return check_metric(name)


@dataclass
class TrainConfig:
    """Hyperparameters of one training run (Cole et al.'s linear protocol by default).

    ``early_stop``: ``"none"`` (fixed epochs, Cole), ``"patience:N"`` (stop after N epochs
    without a better val mAP; ``patience:1`` is Zhou et al.'s rule) or ``"drop:X"`` (stop when
    val mAP falls more than X points below the best, Kim et al.).

    ``weight_decay`` (0: none): L2 on the weights of a head trained on feature vectors (the
    linear and MLP heads, SMILE's classifier), *coupled* as in ``torch.optim.Adam(weight_decay=)``:
    ``weight_decay * w`` is added to the gradient before Adam's moments, because these modes
    train with Adam (the fine-tuning modes train with their own decoupled, AdamW-style decay,
    their ``weight_decay`` option). Biases and a loss's own state are not decayed. A method
    that does not read a field refuses a value other than its default
    (`spmlkit.methods.check_train_fields`).

    Image methods only (a feature method refuses them):

    - ``head_lr_mult``: the head's learning rate is ``lr * head_lr_mult`` (Kim et al.: 10);
    - ``amp``: ``"auto"`` (bfloat16 where the GPU supports it, else float16), ``"bf16"``,
      ``"fp16"`` or ``"none"``; autocast runs the model only, the loss is always float32. AMP
      and ``channels_last`` apply on CUDA only (on a CPU the run is float32, contiguous);
    - ``num_workers``: ``DataLoader`` worker processes per process (0: load in the main one);
    - ``image_size``: side of the square input (default: the backbone's ``input_size``);
    - ``eval_batch_size``: batch of the prediction passes (default ``max(64, batch_size)``).

    ``metric``: what the best epoch is selected on, a name of `spmlkit.metrics.METRICS`
    (``"map"``, val mAP, by default; ``ranking_loss``, ``coverage``, ``coverage_norm``,
    ``one_error`` and ``hamming_loss`` are lower-is-better, the loop flips their sign).

    ``batch_size`` is the global batch: under ``torchrun`` each of the N processes takes its
    share of every batch (see `GlobalBatchSampler`).

    ``drop_last`` (False): leave out each epoch's last, shorter training batch (the rows left
    over after the full batches of the epoch's shuffled order; other rows each epoch). Cole et
    al.'s official loader (and Xie et al.'s LAC code) train with ``drop_last=True``; the default
    keeps every row, as before. It applies to training only: validation (model selection) and
    test are always scored on every row, because a metric over a subset that depends on the
    batch size would make the scores of different grid points incomparable (the official
    loader, as a side effect, also drops the last partial batch of val and test). An epoch's
    ``train_loss`` is then the mean over the rows it trained on. With fewer train rows than
    ``batch_size`` no batch would be left: that is an error.

    ``train_predictions`` (True): the run folder's ``predictions.npz`` holds the train rows'
    probabilities beside val's and test's (what ``spml analyze`` reads). False keeps val and
    test only (the train recovery mAP is still scored): ``spml benchmark``'s default, where
    a grid of runs on many rows would write the train probabilities of every run. It changes no
    number, and no run id.
    """

    epochs: int = 25
    batch_size: int = 8
    lr: float = 1e-4
    seed: int = 0
    early_stop: str = "none"
    map_convention: str = "present"
    device: str = "cpu"
    head_lr_mult: float = 1.0
    amp: str = "auto"
    channels_last: bool = True
    num_workers: int = 0
    image_size: int | None = None
    eval_batch_size: int | None = None
    metric: str = "map"
    drop_last: bool = False
    weight_decay: float = 0.0
    train_predictions: bool = True

    #: what each field accepts (`spmlkit.constraints`): read by the check below, by the
    #: options of ``spml train`` / ``spml benchmark`` and by tests/test_constraints.py
    parameter_constraints: ClassVar[dict] = {
        "epochs": Interval(int, 1, MAX_EPOCHS, too_large="a run that long never finishes (the "
                           "papers train 10 to 100); give fewer epochs, with early_stop to end "
                           "sooner"),
        "batch_size": Interval(int, 1),
        "lr": Interval(float, 0, None, closed="right"),
        "seed": Interval(int, 0, MAX_SEED),
        "early_stop": Rule(lambda spec: parse_early_stop(spec),
                           "'none', 'patience:N' (N >= 1) or 'drop:X' (X >= 0)",
                           bad=("patience:0", "sometimes", 3)),
        "map_convention": Options(MAP_CONVENTIONS),
        "device": Rule(_device_name, "a device name such as cpu, cuda or cuda:1",
                       bad=("gpu0", 3)),
        "head_lr_mult": Interval(float, 0, None, closed="right"),
        "amp": Options(AMP_MODES),
        "channels_last": Boolean(),
        "num_workers": Interval(int, 0),
        "image_size": [Interval(int, 1), None],
        "eval_batch_size": [Interval(int, 1), None],
        "metric": Rule(_metric_name, "a metric name (spml list metrics)",
                       bad=("accuracy", 3)),
        "drop_last": Boolean(),
        "weight_decay": Interval(float, 0),
        "train_predictions": Boolean(),
    }

    def __post_init__(self):
        check_record(self)


def parse_early_stop(spec: str) -> tuple[str, float]:
    """``(kind, arg)`` of an ``early_stop`` spec: ``"none"``, ``"patience:N"``, ``"drop:X"``.

    >>> parse_early_stop("patience:3"), parse_early_stop("none")
    (('patience', 3.0), ('none', 0.0))
    """
    kind, _, arg = str(spec).partition(":")
    try:
        if kind == "none" and not arg:
            return kind, 0.0
        if kind == "patience" and int(arg) >= 1:
            return kind, float(int(arg))
        if kind == "drop" and float(arg) >= 0:
            return kind, float(arg)
    except ValueError:
        pass
    raise ValueError(f"early_stop must be 'none', 'patience:N' (N >= 1) or 'drop:X', got {spec!r}")


def batch_starts(n: int, batch_size: int, drop_last: bool = False) -> range:
    """Where each training batch of an epoch of ``n`` (shuffled) rows starts: every
    ``batch_size``-th row, without the last, shorter batch when ``drop_last``.

    Raises:
        ValueError: ``drop_last`` with fewer than ``batch_size`` rows (no batch left).

    >>> list(batch_starts(10, 4)), list(batch_starts(10, 4, drop_last=True))
    ([0, 4, 8], [0, 4])
    """
    if drop_last:
        if n < batch_size:
            raise ValueError(f"train.drop_last: the training split has {n} rows, fewer than "
                             f"batch_size {batch_size}, so no full batch is left; lower the "
                             f"batch size or leave drop_last off")
        return range(0, n - n % batch_size, batch_size)
    return range(0, n, batch_size)


def epoch_rows(n: int, batch_size: int, drop_last: bool = False) -> int:
    """How many of the ``n`` rows an epoch trains on (`batch_starts`)."""
    return len(batch_starts(n, batch_size, drop_last)) * batch_size if drop_last else n


def config_dict(config: TrainConfig) -> dict:
    """The config as a plain dict (``dataclasses.asdict``)."""
    return asdict(config)



@contextlib.contextmanager
def torch_threads(n: int | None):
    """Run the block with ``n`` torch intra-op threads, then restore the previous number.

    ``spml`` runs with 1 thread by default (``--threads``): a linear head on small batches is
    bound by per-operation overhead, and extra threads only add contention, badly so on a
    machine whose cores are busy with other processes. ``None`` leaves torch's setting as it is.

    Raises:
        ValueError: ``n`` is not a whole number >= 1 (or None).
    """
    import torch

    if n is None:
        yield
        return
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n_threads must be a whole number >= 1 or None, got {n!r}")
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)
