"""Declared constraints of configuration records, after scikit-learn's ``_parameter_constraints``.

A record (`spmlkit.engine.TrainConfig`, `spmlkit.engine.FinetuneOptions`, LAC's and MIME's
configs, each loss) declares one table, ``parameter_constraints = {field: rule, ...}``, where a
rule is a constraint (`Interval`, `Options`, `Boolean`, `Rule`) or a list of alternatives
(``None`` among them: the field may be None). The table is read by

- the record's check (`check_fields`): a value that no alternative accepts is a
  ``ValueError`` ``<Record>.<field> must be <what the rule says>, got <value>``;
- the command line (`option_type`): an option that sets a field parses its text with the
  field's rule, and its help says what the rule accepts (`describe`);
- a generated test (``tests/test_constraints.py``): every field of every record refuses each of
  its rule's `Interval.bad_values` with a message that names the field.

What relates two fields (LAC's ``dim`` a multiple of ``heads``) stays a check of its own in the
record, after its table.

>>> rules = {"lr": Interval(float, 0, None, closed="right"), "amp": Options(("auto", "none"))}
>>> check_fields("TrainConfig", {"lr": 1e-3, "amp": "auto"}, rules)
>>> check_fields("TrainConfig", {"lr": 0.0, "amp": "auto"}, rules)
Traceback (most recent call last):
...
ValueError: TrainConfig.lr must be a finite number > 0, got 0.0
"""
from __future__ import annotations

import math
import numbers
from typing import Callable, Sequence


def _num(x) -> str:
    """A bound as it reads: ``1``, ``4294967295``, ``0.5``, ``1e-05``."""
    return str(x) if isinstance(x, numbers.Integral) else f"{x:g}"


class Interval:
    """A whole number (``kind`` int) or a finite real number (``kind`` float) between ``low``
    and ``high`` (None: unbounded), ``closed`` at ``"both"`` ends, the ``"left"`` one, the
    ``"right"`` one or ``"neither"`` (scikit-learn's convention; an unbounded end is open).
    ``too_large``: why a value above ``high`` is refused, said in place of the range (a bound
    on a typo, not a property of the field). Booleans are no numbers here (``True`` is 1 to
    Python, not to a user)."""

    def __init__(self, kind: type, low=None, high=None, closed: str = "both", *,
                 too_large: str | None = None):
        if kind not in (int, float) or closed not in ("both", "left", "right", "neither"):
            raise ValueError(f"Interval(kind int or float, closed both / left / right / "
                             f"neither), got {kind!r}, {closed!r}")
        self.kind, self.low, self.high, self.closed = kind, low, high, closed
        self.too_large = too_large

    def _is_number(self, value) -> bool:
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or \
                type(value).__name__ == "bool_":
            return False
        if self.kind is int:
            return isinstance(value, numbers.Integral)
        return math.isfinite(value)

    def _above(self, value) -> bool:
        return self.high is not None and (value > self.high or (
            value == self.high and self.closed in ("left", "neither")))

    def accepts(self, value) -> bool:
        if not self._is_number(value):
            return False
        if self.low is not None and (value < self.low or (
                value == self.low and self.closed in ("right", "neither"))):
            return False
        return not self._above(value)

    def refusal(self, name: str, value) -> str:
        """Why ``value`` is refused (for a value this rule does not accept)."""
        if self.too_large and self._is_number(value) and self._above(value):
            return f"{name}={value} is more than {self.high:,}: {self.too_large}"
        return f"{name} must be {self.describe()}, got {value!r}"

    def describe(self) -> str:
        """``a whole number >= 1``, ``a finite number > 0``, ``a number in [0, 1)``; a bound
        with ``too_large`` is not said (its refusal says it)."""
        high = None if self.too_large else self.high
        if self.kind is float and self.low is not None and high is not None:
            left = "[" if self.closed in ("both", "left") else "("
            right = "]" if self.closed in ("both", "right") else ")"
            return f"a number in {left}{_num(self.low)}, {_num(high)}{right}"
        parts = []
        if self.low is not None:
            parts.append(f">= {_num(self.low)}" if self.closed in ("both", "left")
                         else f"> {_num(self.low)}")
        if high is not None:
            parts.append(f"<= {_num(high)}" if self.closed in ("both", "right")
                         else f"< {_num(high)}")
        what = "a whole number" if self.kind is int else "a finite number"
        return f"{what} {' and '.join(parts)}".strip()

    def bad_values(self) -> list:
        """Values the rule refuses: past each bound, a bool, a text and (for reals) NaN."""
        out = [True, "1"]
        if self.low is not None:
            out.append(self.low if self.closed in ("right", "neither") else
                       self.low - (1 if self.kind is int else 1e-3 * max(1, abs(self.low))))
        if self.high is not None:
            out.append(self.high if self.closed in ("left", "neither") else
                       self.high + (1 if self.kind is int else 1e-3 * max(1, abs(self.high))))
        if self.kind is float:
            out.append(float("nan"))
        else:
            out.append(1.5 if self.accepts(1) or self.accepts(2) else 0.5)
        return out

    def parse(self, text: str):
        """The value of a command-line ``text`` (a ValueError naming what was expected)."""
        try:
            value = self.kind(text) if self.kind is float else int(text)
        except ValueError:
            raise ValueError(f"expected {self.describe()}, got {text!r}") from None
        return value


class Options:
    """One of ``values`` (names: compared as they are)."""

    def __init__(self, values: Sequence):
        self.values = tuple(values)

    def accepts(self, value) -> bool:
        return isinstance(value, str) and value in self.values

    def refusal(self, name: str, value) -> str:
        return f"{name} must be {self.describe()}, got {value!r}"

    def describe(self) -> str:
        return "one of " + ", ".join(repr(v) for v in self.values)

    def bad_values(self) -> list:
        return ["no-such-option", 1]

    def parse(self, text: str):
        return text


class Boolean:
    """True or false (a bool, numpy's too; not 0 / 1, not a text)."""

    def accepts(self, value) -> bool:
        return isinstance(value, bool) or type(value).__name__ == "bool_"

    def refusal(self, name: str, value) -> str:
        return f"{name} must be {self.describe()}, got {value!r}"

    def describe(self) -> str:
        return "true or false"

    def bad_values(self) -> list:
        return [1, "yes"]

    def parse(self, text: str):
        raise ValueError("a switch takes no value")


class Rule:
    """A value ``check`` accepts: ``check(value)`` raises ``ValueError`` (whose message is the
    refusal, naming the field) for one it does not; ``text`` says what it accepts, ``bad``
    lists values it refuses (for the generated test)."""

    def __init__(self, check: Callable, text: str, bad: Sequence):
        self.check, self.text, self.bad = check, text, list(bad)

    def reason(self, value) -> str | None:
        """What ``check`` says of ``value`` (None: it accepts it)."""
        try:
            self.check(value)
        except (ValueError, TypeError) as err:
            return str(err)
        return None

    def accepts(self, value) -> bool:
        return self.reason(value) is None

    def refusal(self, name: str, value) -> str:
        bare = name.replace(" ", ".").rsplit(".", 1)[-1]
        said = self.reason(value) or f"{bare} must be {self.text}, got {value!r}"
        # a check that names the field: with its owner; one that does not: after it
        return f"{name}{said[len(bare):]}" if said.startswith(bare) else f"{name}: {said}"

    def describe(self) -> str:
        return self.text

    def bad_values(self) -> list:
        return list(self.bad)

    def parse(self, text: str):
        return text


def alternatives(rule) -> list:
    """The rule of a table entry as a list of alternatives (``None``: the value None)."""
    return list(rule) if isinstance(rule, (list, tuple)) else [rule]


def describe(rule) -> str:
    """What a table entry accepts, in words (``a whole number >= 1 or None``)."""
    return " or ".join("None" if r is None else r.describe() for r in alternatives(rule))


def accepts(rule, value) -> bool:
    return any(value is None if r is None else r.accepts(value) for r in alternatives(rule))


def refusal(owner: str, name: str, rule, value) -> str:
    """The message for a refused ``value`` of ``owner``'s field ``name``: ``owner.name ...``,
    or ``owner name ...`` for an owner that ends with a colon (``loss 'epr': lam ...``)."""
    field = (f"{owner} {name}" if owner.endswith(":") else f"{owner}.{name}") if owner else name
    rules = alternatives(rule)
    if len(rules) == 1 and rules[0] is not None:
        return rules[0].refusal(field, value)
    return f"{field} must be {describe(rule)}, got {value!r}"


def check_fields(owner: str, values: dict, table: dict) -> None:
    """Check each field of ``table`` in ``values`` (a record's fields by name) against its rule,
    in the table's order; the first refused raises ``ValueError`` naming ``owner.field``, what
    its rule accepts and the value."""
    for name, rule in table.items():
        value = values[name]
        if not accepts(rule, value):
            raise ValueError(refusal(owner, name, rule, value))


def check_record(record) -> None:
    """`check_fields` of a dataclass ``record`` against its class's
    ``parameter_constraints``."""
    table = type(record).parameter_constraints
    check_fields(type(record).__name__, {name: getattr(record, name) for name in table}, table)


def declared(cls) -> dict:
    """The ``parameter_constraints`` of ``cls`` and of the classes it derives from, merged (a
    class's own entry over its base's): the table of a loss, whose hyperparameters its class
    chain takes."""
    out: dict = {}
    for klass in reversed(cls.__mro__):
        out.update(vars(klass).get("parameter_constraints", {}))
    return out


def option_type(rule, flag: str, field: str | None = None):
    """An argparse ``type`` for an option that sets a field with this ``rule``: the text parsed
    as the rule reads it, then checked; a refusal is argparse's error naming the option
    (``argument --epochs: expected a whole number >= 1, got 0``)."""
    import argparse

    field = field or flag.lstrip("-").replace("-", "_")
    first = next(r for r in alternatives(rule) if r is not None)

    def parse(text: str):
        try:
            value = first.parse(text)
        except ValueError as err:
            raise argparse.ArgumentTypeError(str(err)) from None
        if accepts(rule, value):
            return value
        if isinstance(first, Rule):  # its check's own words
            raise argparse.ArgumentTypeError(first.reason(value))
        if isinstance(first, Interval) and first.too_large and first._above(value):
            raise argparse.ArgumentTypeError(first.refusal(field, value))
        shown = value if isinstance(first, Interval) and first.kind is int else text
        raise argparse.ArgumentTypeError(f"expected {describe(rule)}, got {shown!r}"
                                         if isinstance(shown, str) else
                                         f"expected {describe(rule)}, got {shown}")

    parse.__name__ = field  # argparse names the type in its "invalid ... value" errors
    return parse
