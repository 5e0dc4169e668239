"""Methods: recipes with their own state and schedule on top of the losses and models.

A method differs from a loss (:mod:`spmlkit.losses`) in that it owns its model, its views and
its training schedule: LAC (Xie et al., NeurIPS 2022) trains a label-wise embedding model on a
weak and a strong view in two stages (:mod:`spmlkit.methods.lac`). Each method provides a run
trainer with the contract of :func:`spmlkit.experiments.runner.train_one` (see the study runner,
mode ``lac``).
"""
from __future__ import annotations

from .lac import ABLATIONS, LACConfig, load_lac_model, resume_lac, train_lac

__all__ = ["ABLATIONS", "LACConfig", "load_lac_model", "resume_lac", "train_lac"]
