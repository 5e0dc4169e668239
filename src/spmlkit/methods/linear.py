"""``linear``: a linear head on feature vectors (Cole et al.'s linear protocol).

The features are the dataset's own (yeast, ``arrays``, the authors' published ResNet-50
features) or an image source's cached backbone features (``--backbone``). The engine's
`spmlkit.engine.fit_linear` trains the head; the best epoch (val mAP) is kept.

Options ``head`` (``"linear"``, the default, or ``"mlp"``: `spmlkit.models.heads.MLPHead`,
one hidden ReLU layer of ``hidden`` units, default 256; the tabular SPML protocol's MLP) and
``save_train_probs``: also store the eval-mode train probabilities after every epoch
as ``train_probs.npy`` (epochs x N_train x L, float16; row ``e - 1`` is epoch ``e``), for
`spmlkit.analysis.unobserved_positive_histograms` (needs a run folder).
"""
from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
import torch

from ..data.rows import Rows, as_rows, is_stored
from ..engine import fit_linear, predict_logits
from ..engine.linear import to_device
from ..engine.vectorised import fit_linear_stacked
from ..metrics import is_partial
from ..runs import TRAIN_PROBS_FILE
from .contract import Fitted, RunContext, TrainingMethod, feature_preprocess, register_method


def _features(x):
    """Features as the engine reads them: stored ones (a memory map, ``Rows``) as they are,
    read chunk by chunk; others as one float32 tensor."""
    return x if is_stored(x) or torch.is_tensor(x) else torch.as_tensor(np.asarray(x, np.float32))


@torch.no_grad()
def _probs(model, x) -> np.ndarray:
    device = next(model.parameters()).device
    x = _features(x)
    if not is_stored(x):
        return torch.sigmoid(predict_logits(model, x.to(device))).cpu().numpy()
    out = None  # stored rows: each chunk's probabilities into one float32 array
    was = model.training
    model.eval()
    for start, block in as_rows(x).chunks():
        p = torch.sigmoid(model(to_device(block, device)).float()).cpu().numpy()
        if out is None:
            out = np.empty((len(x), p.shape[1]), dtype=np.float32)
        out[start:start + len(p)] = p
    model.train(was)
    return out


@torch.no_grad()
def _prob_chunks(model, x):
    """``(start, probabilities)`` of ``x``'s rows chunk by chunk
    (`CHUNK_ROWS` rows, float32), the values `_probs` gives."""
    from ..data import rows as stored_rows

    device = next(model.parameters()).device
    x = _features(x)
    chunk = stored_rows.CHUNK_ROWS
    if is_stored(x):
        was = model.training
        model.eval()
        for start, block in as_rows(x).chunks(chunk):
            yield start, torch.sigmoid(model(to_device(block, device)).float()).cpu().numpy()
        model.train(was)
        return
    for start in range(0, len(x), chunk):
        yield start, torch.sigmoid(predict_logits(model, x[start:start + chunk].to(device),
                                                  chunk)).cpu().numpy()


class _EpochProbs:
    """``save_train_probs``: each epoch's eval-mode train probabilities (float16), written chunk
    by chunk into a memory map of a nameless temporary file in the run folder (gone when let
    go), so the epochs x N x L probabilities are never in memory; `written` is what
    ``train_probs.npy`` gets (the epochs run, in order)."""

    def __init__(self, folder, epochs: int, shape: tuple):
        import tempfile

        from ..safe_write import preallocate

        shape = (max(int(epochs), 1), *shape)
        with tempfile.TemporaryFile(prefix=".train-probs-", dir=folder) as f:
            # reserved first: a full disk is an error naming the file, not a SIGBUS later
            preallocate(f.fileno(), 2 * int(np.prod(shape)), Path(folder) / TRAIN_PROBS_FILE)
            self.array = np.memmap(f, dtype=np.float16, mode="w+", shape=shape)
        self.count = 0

    def add(self, model, x) -> None:
        out = self.array[self.count]
        for start, p in _prob_chunks(model, x):
            out[start:start + len(p)] = p.astype(np.float16)
        self.count += 1

    def written(self) -> np.ndarray:
        return self.array[:self.count]


#: the most ``save_train_probs`` may write (the probabilities of every epoch)
MAX_TRAIN_PROBS_BYTES = 8 * 2**30


def check_run(splits, config, options: dict, resume=None) -> None:
    """``save_train_probs`` refused where it cannot work (a resume; more than
    `MAX_TRAIN_PROBS_BYTES` of probabilities), an MLP head that cannot fit in memory,
    before the run folder is made."""
    if options["head"] == "mlp":  # weights, gradients, two Adam moments; a batch's activations
        from ..resources import check_memory

        d, n_labels, hidden = splits.train.x.shape[1], splits.observed.shape[1], \
            int(options["hidden"])
        params = (d + 1) * hidden + (hidden + 1) * n_labels
        check_memory(4 * (4 * params + 3 * config.batch_size * hidden),
                     f"an MLP head with hidden={hidden} ({params:,} weights)",
                     "give a smaller --hidden (the tabular protocol uses 256)")
    if not options["save_train_probs"]:
        return
    if resume is not None:
        raise ValueError("a run with save_train_probs cannot resume (the probabilities of the "
                         "epochs before the interruption are not in its checkpoint); train it "
                         "again")
    size = config.epochs * splits.observed.shape[0] * splits.observed.shape[1] * 2  # float16
    if size > MAX_TRAIN_PROBS_BYTES:  # (a file in the run folder, twice: then train_probs.npy)
        raise ValueError(f"save_train_probs: {config.epochs} epochs of "
                         f"{splits.observed.shape[0]} x {splits.observed.shape[1]} train "
                         f"probabilities are {size / 2**30:.1f} GiB, more than the "
                         f"{MAX_TRAIN_PROBS_BYTES // 2**30} GiB written to the run folder; "
                         f"train fewer epochs or without --save-train-probs")


def fit(ctx: RunContext) -> Fitted:
    splits, options = ctx.splits, ctx.options
    save_probs = bool(options["save_train_probs"])
    if save_probs and ctx.run_dir is None:
        raise ValueError("save_train_probs=True stores train_probs.npy in the run folder: give "
                         "out= (the folder the run folder is created in)")
    x_train = _features(splits.train.x)
    head = None  # linear: fit_linear's own nn.Linear, as it always was
    if options["head"] != "linear":
        from ..models.heads import make_head

        head = make_head(options["head"], x_train.shape[1], splits.observed.shape[1],
                         ctx.config.seed, options["hidden"])
    epoch_probs = _EpochProbs(ctx.run_dir, ctx.config.epochs, splits.observed.shape) \
        if save_probs else None

    def on_epoch(record, model, loss_module):
        if save_probs:
            epoch_probs.add(model, x_train)
        ctx.on_epoch(record, model, loss_module)

    model, result = fit_linear(splits.train.x, splits.observed, ctx.loss, ctx.config,
                               x_val=splits.val.x, y_val=splits.val.y, k=ctx.k,
                               on_epoch=on_epoch, checkpoint=ctx.checkpoint, resume=ctx.resume,
                               model=head)
    sets = {"train": x_train, "val": splits.val.x, "test": splits.test.x}
    # stored features: each split's probabilities computed when the run's scoring first reads
    # them (the train split's N x L float32 last, after the val threshold sweep)
    probs = _LazyProbs(model, sets) if is_stored(x_train) else \
        {split: _probs(model, x) for split, x in sets.items()}
    best = {"model": model.state_dict(), "in_features": int(np.shape(splits.train.x)[1]),
            "preprocess": feature_preprocess(splits)}
    if head is not None:
        best.update(head=options["head"], hidden=int(options["hidden"]))
    files = {TRAIN_PROBS_FILE: epoch_probs.written()} if save_probs else {}
    return Fitted(result, probs, best, files=files)


class _LazyProbs(Mapping):
    """A stacked run's probabilities of train, val and test, each computed when first read
    (``train_runs`` scores and writes one run after the other and lets each go, so the runs'
    N x L outputs are not all in memory at once)."""

    def __init__(self, model, sets: dict):
        self._model, self._sets, self._done = model, sets, {}

    def __getitem__(self, split):
        if split not in self._done:
            self._done[split] = _probs(self._model, self._sets[split])
        return self._done[split]

    def __iter__(self):
        return iter(self._sets)

    def __len__(self) -> int:
        return len(self._sets)


def _fitted(ctx: RunContext, model, result, x_train) -> Fitted:
    splits = ctx.splits
    probs = _LazyProbs(model, {"train": x_train, "val": splits.val.x, "test": splits.test.x})
    best = {"model": model.state_dict(), "in_features": int(np.shape(splits.train.x)[1]),
            "preprocess": feature_preprocess(splits)}
    return Fitted(result, probs, best)


def stack_refusal(options: dict) -> str | None:
    """Why runs with these options (defaults filled in) train one by one, None when
    `fit_many` can stack them: a stack is linear heads that store no per-epoch train
    probabilities (``TrainingMethod.can_stack``; the study groups its runs by it)."""
    if options["save_train_probs"]:
        return "save_train_probs stores one run's probabilities per epoch"
    if options["head"] != "linear":
        return f"head {options['head']!r}: only linear heads are stacked"
    return None


def fit_many(contexts: list[RunContext]) -> list:
    """Several runs at once (`spmlkit.engine.vectorised.fit_linear_stacked`): per context
    its ``Fitted`` or the exception that ended it. The runs share their features (runs whose
    train or val data differ are stacked apart); they share one loss and observed labels, or
    their losses are all closed-form (then their losses, hyperparameters, regimes and k may
    differ). Runs with ``save_train_probs``, an MLP head or a resume are refused (train these
    one by one).

    A run that fails fails alone: the stacked engine ends a diverged run (or one whose hooks or
    callbacks raise) and trains the others on; an error of the stack as a whole (a loss that
    raises in the stacked step or when its labels are set) trains each of its runs alone
    (`fit`), so every other run ends as ``train_run`` would end it."""
    for ctx in contexts:
        if stack_refusal(ctx.options) is not None or ctx.resume is not None:
            raise ValueError("stacked linear runs take neither save_train_probs, an MLP head "
                             "nor resume; train these runs one by one (train_run)")
    stacks: list[list[int]] = []  # runs on the same features
    for i, ctx in enumerate(contexts):
        for stack in stacks:
            if _same_features(contexts[stack[0]].splits, ctx.splits):
                stack.append(i)
                break
        else:
            stacks.append([i])
    fitted: list = [None] * len(contexts)
    for stack in stacks:
        ctxs = [contexts[i] for i in stack]
        splits = ctxs[0].splits
        if is_partial(splits.val.y):  # the stacked engine scores full val labels only
            for i, ctx in zip(stack, ctxs):
                fitted[i] = _alone(ctx)
            continue
        x_train = _features(splits.train.x)
        try:
            out = fit_linear_stacked(
                x_train, [c.splits.observed for c in ctxs], [c.loss for c in ctxs],
                [c.config for c in ctxs], x_val=splits.val.x, y_val=splits.val.y,
                k=[c.k for c in ctxs], on_epoch=[c.on_epoch for c in ctxs],
                checkpoint=[c.checkpoint for c in ctxs])
        except Exception as err:  # noqa: BLE001 (the stack as a whole: which run is unknown)
            if len(ctxs) == 1:
                out = [err]
            else:  # each run trains alone, as train_run would: one that fails, fails alone
                for i, ctx in zip(stack, ctxs):
                    fitted[i] = _alone(ctx)
                continue
        for i, ctx, item in zip(stack, ctxs, out):
            if isinstance(item, BaseException):
                fitted[i] = item
                continue
            try:
                fitted[i] = _fitted(ctx, item[0], item[1], x_train)
            except Exception as err:
                fitted[i] = err
    return fitted


def _alone(ctx: RunContext):
    """A run of a stack that raised as a whole, trained on its own (`fit`, what
    ``train_run`` runs): a fresh loss module (the stack's hooks changed the old one) and no epoch
    records of the stacked try. Its ``Fitted``, or the exception that ended it."""
    from ..losses import bind_groups, create_loss
    from ..runs import METRICS_FILE

    try:
        ctx.loss = create_loss(ctx.loss_name, **ctx.hparams)
        bind_groups(ctx.loss, ctx.splits.train.groups)
        if ctx.run_dir is not None:
            (Path(ctx.run_dir) / METRICS_FILE).unlink(missing_ok=True)
        return fit(ctx)
    except Exception as err:  # noqa: BLE001 (this run's own failure)
        return err


def _same_features(a, b) -> bool:
    """Whether two splits have the same train and val features and val labels (the runs of
    one dataset under different regimes do)."""
    if a is b:
        return True
    pairs = ((a.train.x, b.train.x), (a.val.x, b.val.x), (a.val.y, b.val.y))
    return all(_same(p, q) for p, q in pairs)


def _same(p, q) -> bool:
    """Whether two feature (or label) matrices hold the same rows; stored features compare by
    their store, rows and standardisation (nothing is read)."""
    if p is q:
        return True
    if isinstance(p, Rows) or isinstance(q, Rows):
        if not (isinstance(p, Rows) and isinstance(q, Rows)):
            return False
        same_base = p.base is q.base or (p.filename is not None and p.filename == q.filename)
        return same_base and all(
            (u is None and v is None) or (u is not None and v is not None and
                                          np.array_equal(u, v))
            for u, v in ((p.rows, q.rows), (p.shift, q.shift), (p.scale, q.scale)))
    return np.shape(p) == np.shape(q) and np.array_equal(p, q)


def load_model(best: dict, config: dict):
    """The linear head (inputs: features), or for a run on a backbone's cached features of an
    image source, the backbone rebuilt by name with the head on top (inputs: images)."""
    if best.get("head", "linear") == "mlp":
        from ..models.heads import MLPHead

        state = best["model"]
        head = MLPHead(state["hidden.weight"].shape[1], state["out.weight"].shape[0],
                       int(best["hidden"]))
    else:
        weight = best["model"]["weight"]
        head = torch.nn.Linear(weight.shape[1], weight.shape[0])
    head.load_state_dict(best["model"])
    options = config.get("dataset_options") or {}
    name = options.get("backbone")
    if not name:
        return head, {"inputs": "features", "in_features": int(head.in_features)}
    from ..models.backbones import create_backbone
    from ..models.heads import ImageClassifier

    feats = options.get("features") or {}
    backbone = create_backbone(name, pretrained=bool(feats.get("pretrained", True)),
                               weights=feats.get("weights"))
    model = ImageClassifier(backbone, int(best["num_classes"]))
    if isinstance(head, torch.nn.Linear):
        model.head.load_state_dict(best["model"])
    else:
        model.head = head
    size = int(feats.get("size") or backbone.input_size)
    return model, {"inputs": "images", "image_size": size, "mean": tuple(backbone.mean),
                   "std": tuple(backbone.std)}


def check_values(options: dict) -> None:
    """The linear mode's option check (``TrainingMethod.check_values``): ``head`` one of
    `spmlkit.models.heads.HEADS`, ``hidden`` a whole number >= 1 for an MLP head."""
    from ..models.heads import HEADS

    if options["head"] not in HEADS:
        raise ValueError(f"head must be one of {HEADS}, got {options['head']!r}")
    hidden = options["hidden"]
    if options["head"] == "mlp" and (isinstance(hidden, bool) or not isinstance(hidden, int)
                                     or hidden < 1):
        raise ValueError(f"hidden (the MLP head's width) must be a whole number >= 1, got "
                         f"{hidden!r}")


LINEAR = register_method(TrainingMethod(
    name="linear", description="a linear head on feature vectors (the dataset's, or an image "
    "source's cached backbone features with --backbone); Cole et al.'s linear protocol",
    paper="Cole et al. 2021", inputs="features", fit=fit, load_model=load_model,
    options={"save_train_probs": False, "head": "linear", "hidden": 256}, fit_many=fit_many,
    check_run=check_run, stack_refusal=stack_refusal, check_values=check_values,
    train_fields=("weight_decay",),
    default_lr=1e-3,
    default_lr_source="what Cole et al.'s grid (lr 1e-2 ... 1e-5, batch 8 / 16) "
    "selected in all but one of the yeast benchmark's selections (docs/results.md, the default "
    "benchmark on yeast); 1e-4 under-trains a linear head in 25 epochs",
    run_config=lambda ctx: {"save_train_probs": bool(ctx.options["save_train_probs"]),
                            **({"head": ctx.options["head"], "hidden": ctx.options["hidden"]}
                               if ctx.options["head"] != "linear" else {})}))
