"""Training methods: how a model is trained on a dataset's splits with a loss.

One registry (:data:`METHODS`), one driver (:func:`train_run`), one way back to a trained model
(:func:`load_run_model`); see :mod:`spmlkit.methods.contract` (what a method is) and
:mod:`spmlkit.methods.driver` (how it runs). Registered here: ``linear`` (:mod:`.linear`),
``finetune`` and ``linear_init`` (:mod:`.finetune`), ``lac`` (:mod:`.lac`, Xie et al. 2022),
``smile`` (:mod:`.smile`, Xu et al. 2022), ``mime`` (:mod:`.mime`, Liu et al. 2023),
``boostlu`` (:mod:`.boostlu`, Kim et al. 2023).
"""
from __future__ import annotations

from .contract import (METHODS, SELECTED_LR, Fitted, RunContext, TrainingMethod, check_inputs,
                       check_train_fields,
                       default_lr, get_method, list_methods, preprocess_features,
                       register_method, resolve_hparams, resolve_k)
from .driver import (ResumeError, load_run_model, pseudo_label_record, resume_run, train_run,
                     train_runs, training_warnings, versions)

# the built-in methods register themselves, in this order (spml list methods)
from . import linear  # noqa: E402,F401
from . import finetune  # noqa: E402,F401
from . import lac  # noqa: E402,F401
from . import smile  # noqa: E402,F401
from . import mime  # noqa: E402,F401
from . import boostlu  # noqa: E402,F401

__all__ = ["METHODS", "SELECTED_LR", "Fitted", "ResumeError", "RunContext", "TrainingMethod",
           "check_inputs", "check_train_fields", "default_lr", "get_method", "list_methods",
           "load_run_model",
           "preprocess_features", "pseudo_label_record", "register_method", "resolve_hparams",
           "resolve_k", "resume_run", "train_run", "train_runs", "training_warnings", "versions"]
