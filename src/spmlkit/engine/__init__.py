"""The training engine: one loop for every mode and method, and the modes built on it.

`train_loop` (`loop`) is the one loop: stages (each with its epochs and a set-up
that builds its optimiser, schedule and extra state), per-step hooks, several evaluators (the
epoch's score is the best of them), early stopping per stage, and checkpoint / resume of the
whole state. The modes differ only in their stages, where batches come from and how a batch
becomes logits:

- `fit_linear` (`linear`): a linear head on features held in memory. One epoch = a
  seeded permutation of the train rows, cut into batches that index pre-loaded tensors (no
  per-row ``DataLoader``).
- `fit_linear_stacked` (`vectorised`): R linear runs that differ only in seed and
  learning rate trained at once as one stacked head (the linear protocol's grids are
  overhead-bound); each run ends as it would alone, up to float summation order. Studies use it
  through `spmlkit.methods.train_runs` for every stackable loss (``SPMLLoss.stackable``).
- `fit_finetune` (`finetune`, batches from `image_batches`): end to end from image
  items, a ``torch`` ``DataLoader`` with worker processes and a seeded sampler; the weak view
  for training, the eval transform for val and train predictions; AMP (`amp`) and
  channels-last on CUDA; one process or many under ``torchrun`` (`spmlkit.distributed`).
- `fit_linear_init` (Cole et al.): the linear phase on cached features, then
  fine-tuning from that head, with the loss (ROLE's label estimator) carried over.
- LAC (`spmlkit.methods.lac`): two stages with AdamW, a OneCycle schedule, an EMA scored
  beside the model, and the PLC / LAC terms as step hooks.

Adam with no weight decay and no schedule (Cole et al.) in the linear and fine-tuning modes;
the loss's own trainable state (ROLE's label estimator) at ``loss.lr_multiplier`` times the
learning rate, the head of a fine-tuned model at ``config.head_lr_mult`` times. After every
epoch the model is scored on the validation split; the best epoch (val mAP) is kept, with
optional early stopping. The engine knows a method only through the hooks of
[`spmlkit.losses.SPMLLoss`][spmlkit.losses.SPMLLoss] (and, for a recipe such as LAC, the stages and
step hooks it hands to `train_loop`).

Every ``fit_*`` takes ``checkpoint=`` (called after every epoch with a function that builds
the resumable state; the caller decides whether and when to write it) and ``resume=`` (such a
state): a resumed run ends with the uninterrupted run's weights, history and best epoch.
"""
from ..accel import Acceleration, acceleration, current_acceleration
from .amp import LossScaler, amp_dtype
from .config import (AMP_MODES, TrainConfig, batch_starts, check_device, config_dict,
                     epoch_rows, parse_early_stop, torch_threads)
from .finetune import LINEAR_INIT_FORMAT, FinetuneOptions, fit_finetune, fit_linear_init, \
    predict_items
from .image_batches import (GlobalBatchSampler, ImageItems, ItemPredictor, default_image_reader,
                            mix_seed, shares)
from .linear import fit_linear, make_linear_head, predict_logits, val_map
from .loop import (STATE_FORMAT, Batch, FitResult, GeneratorState, Stage, StageParts,
                   StepBatch, StepHook, check_val_labels, train_loop)
from .optim import LeanAdam, make_optimizer
from .selection import Selection, no_finite_val_map, snapshot
from .vectorised import fit_linear_stacked

__all__ = ["AMP_MODES", "Acceleration", "Batch", "acceleration", "current_acceleration",
           "amp_dtype", "FitResult", "GeneratorState", "GlobalBatchSampler",
           "ImageItems", "ItemPredictor", "LINEAR_INIT_FORMAT", "LeanAdam", "LossScaler",
           "STATE_FORMAT", "Selection", "Stage", "StageParts", "StepBatch", "StepHook",
           "TrainConfig", "FinetuneOptions", "batch_starts", "check_device", "check_val_labels",
           "config_dict",
           "default_image_reader", "epoch_rows", "fit_finetune",
           "fit_linear", "fit_linear_init", "fit_linear_stacked",
           "make_linear_head",
           "make_optimizer", "mix_seed", "no_finite_val_map", "parse_early_stop",
           "predict_items", "predict_logits", "shares", "snapshot", "torch_threads", "train_loop",
           "val_map"]
