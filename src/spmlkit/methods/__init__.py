"""Training methods: how a model is trained on a dataset's splits with a loss.

One registry (`METHODS`), one driver ([`train_run`][spmlkit.methods.driver.train_run]), one way back
to a trained model ([`load_run_model`][spmlkit.methods.saved.load_run_model]); see
`spmlkit.methods.contract` (what a method is) and `spmlkit.methods.driver` (how it runs). Registered
here: ``linear`` (`linear`), ``finetune`` and ``linear_init`` (`finetune`), ``lac`` (`lac`, Xie et
al. 2022), ``smile`` (`smile`, Xu et al. 2022), ``mime`` (`mime`, Liu et al. 2023),
``boostlu`` (`boostlu`, Kim et al. 2023), ``solve`` (`solve`: the head solved along a C
path, `spmlkit.engine.solve`).
"""
from __future__ import annotations

from .contract import (METHODS, SELECTED_LR, Fitted, RunContext, TrainingMethod, check_inputs,
                       check_train_fields,
                       default_lr, get_method, list_methods, preprocess_features,
                       register_method, resolve_hparams, resolve_k)
from .driver import pseudo_label_record, resume_run, train_run, train_runs, training_warnings
from .provenance import ResumeError, versions
from .saved import load_run_model

# the built-in methods register themselves, in this order (spml list methods)
from . import linear  # noqa: E402,F401
from . import finetune  # noqa: E402,F401
from . import lac  # noqa: E402,F401
from . import smile  # noqa: E402,F401
from . import mime  # noqa: E402,F401
from . import boostlu  # noqa: E402,F401
from . import solve  # noqa: E402,F401

__all__ = ["METHODS", "SELECTED_LR", "Fitted", "ResumeError", "RunContext", "TrainingMethod",
           "check_inputs", "check_train_fields", "default_lr", "get_method", "list_methods",
           "load_run_model",
           "preprocess_features", "pseudo_label_record", "register_method", "resolve_hparams",
           "resolve_k", "resume_run", "train_run", "train_runs", "training_warnings", "versions"]
