"""The declared constraints of the configuration records (`spmlkit.constraints`), tested as
generated from the tables: every field of every record (the train and fine-tuning configs,
LAC's and MIME's, every registered loss's hyperparameters) refuses each bad value its rule
names, with a ``ValueError`` naming the record's field; every field has a rule; the defaults
pass; the command-line options that set a field read its rule."""
from __future__ import annotations

import argparse
import dataclasses
import math
import re

import pytest

from spmlkit import constraints as C
from spmlkit.engine import FinetuneOptions, TrainConfig
from spmlkit.losses import LOSSES, create_loss, loss_hparams
from spmlkit.methods.lac import LACConfig
from spmlkit.methods.mime import MIMEConfig

RECORDS = (TrainConfig, FinetuneOptions, LACConfig, MIMEConfig)


def _cases():
    for record in RECORDS:
        for field, rule in record.parameter_constraints.items():
            for rule_one in C.alternatives(rule):
                if rule_one is None:
                    continue
                for bad in rule_one.bad_values():
                    if not C.accepts(rule, bad):
                        yield pytest.param(record, field, bad,
                                           id=f"{record.__name__}.{field}={bad!r}")


@pytest.mark.parametrize("record, field, bad", list(_cases()))
def test_every_field_refuses_a_bad_value_naming_the_field(record, field, bad):
    with pytest.raises(ValueError) as err:
        record(**{field: bad})
    assert f"{record.__name__}.{field}" in str(err.value)
    shown = repr(bad) if not (isinstance(bad, float) and math.isnan(bad)) else "nan"
    assert shown in str(err.value) or str(bad) in str(err.value)


@pytest.mark.parametrize("record", RECORDS, ids=lambda r: r.__name__)
def test_every_field_has_a_rule_and_the_defaults_pass(record):
    assert set(record.parameter_constraints) == {f.name for f in dataclasses.fields(record)}
    record()


def _bad_values(rule):
    for one in C.alternatives(rule):
        for bad in ([] if one is None else one.bad_values()):
            if not C.accepts(rule, bad):
                yield bad


def _loss_cases():
    for entry in LOSSES.entries():
        table = C.declared(entry.factory)
        for hp in loss_hparams(entry.name):
            for bad in _bad_values(table[hp]):
                yield pytest.param(entry, hp, bad, id=f"{entry.name}.{hp}={bad!r}")


@pytest.mark.parametrize("entry, hp, bad", list(_loss_cases()))
def test_every_loss_hyperparameter_refuses_a_bad_value_naming_it(entry, hp, bad):
    """Built directly (its ``__init__`` checks its table) and through `create_loss` (which
    checks the table before it builds anything)."""
    names = [e.name for e in LOSSES.entries() if e.factory is entry.factory]  # (its aliases)
    with pytest.raises(ValueError, match="|".join(re.escape(f"loss {n!r}: {hp}") for n in names)):
        entry.factory(**{**entry.defaults, hp: bad})
    with pytest.raises(ValueError, match=re.escape(f"loss {entry.name!r}: {hp}")):
        create_loss(entry.name, **{hp: bad})


@pytest.mark.parametrize("entry", LOSSES.entries(), ids=lambda e: e.name)
def test_every_loss_hyperparameter_has_a_rule_and_the_defaults_pass(entry):
    table = C.declared(entry.factory)
    assert set(loss_hparams(entry.name)) <= set(table)
    for hp, value in loss_hparams(entry.name).items():
        assert C.accepts(table[hp], value), (hp, value)


def test_the_rules_say_what_they_accept():
    assert C.describe(TrainConfig.parameter_constraints["lr"]) == "a finite number > 0"
    assert C.describe(TrainConfig.parameter_constraints["image_size"]) == \
        "a whole number >= 1 or None"
    assert C.describe(LACConfig.parameter_constraints["pct_start"]) == "a number in (0, 1)"
    assert C.describe(LACConfig.parameter_constraints["dropout"]) == "a number in [0, 1)"
    assert C.describe(TrainConfig.parameter_constraints["amp"]) == \
        "one of 'auto', 'none', 'bf16', 'fp16'"


def test_an_interval_refuses_bools_texts_and_non_finite_numbers():
    rule = C.Interval(float, 0, None)
    assert rule.accepts(0) and rule.accepts(2.5)
    for value in (True, "1", float("inf"), float("nan"), -1e-9, None):
        assert not rule.accepts(value)
    whole = C.Interval(int, 1, 10, too_large="too many")
    assert whole.accepts(10) and not whole.accepts(11) and not whole.accepts(2.0)
    assert whole.refusal("x", 11) == "x=11 is more than 10: too many"


def _field_options():
    """Every option of the ``spml`` commands that sets a record's field
    (`spmlkit.cli.groups.field_option`)."""
    from spmlkit.cli import build_parser

    subs = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    for parser in subs.choices.values():
        for action in parser._actions:
            if getattr(action, "sets_field", None):
                yield action


def test_the_options_that_set_a_field_read_its_rule():
    seen = set()
    for action in _field_options():
        record, field = action.sets_field
        rule = [r for r in C.alternatives(record.parameter_constraints[field]) if r][0]
        seen.add((record.__name__, field))
        if isinstance(rule, C.Options):
            assert action.choices == list(rule.values), action.dest
            continue
        for bad in rule.bad_values():  # as the command line gives them: numbers, or words
            if isinstance(bad, bool) or (isinstance(bad, float) and math.isnan(bad)) or \
                    isinstance(bad, str) != isinstance(rule, C.Rule):
                continue
            with pytest.raises(argparse.ArgumentTypeError):
                action.type(str(bad))
        if isinstance(rule, C.Interval):
            assert C.describe(rule) in action.help, action.dest
    assert {("TrainConfig", "epochs"), ("TrainConfig", "lr"), ("TrainConfig", "weight_decay"),
            ("FinetuneOptions", "warmup_epochs"), ("FinetuneOptions", "schedule")} <= seen
