"""Checks of a dataset source's options against its signature, before the source runs.

Options reach a source as keywords (``--data KEY=VALUE``, a study's ``data:`` map, a run's
``dataset_options``). A misspelt key, a missing required one or a value of the wrong type would
otherwise surface as a ``TypeError`` from deep inside the source; `check_source_options`
turns each into a ``ValueError`` that names the dataset, the key, the value and what the source
takes, all generated from the source function's signature (its parameters, defaults and
annotations), so a new source needs nothing extra.

>>> try:
...     check_source_options("yeast", {"subsampel": 0.5}, protocol=("subsample",))
... except ValueError as err:
...     print(err)  # doctest: +NORMALIZE_WHITESPACE
unknown option 'subsampel' for dataset 'yeast'; did you mean 'subsample'?
It takes: path, seed, subsample (spml list datasets yeast --details: each option's type,
default and meaning)

The same table for the user, generated from the signatures and the ``Args:`` sections of the
docstrings (`describe_options`, ``spml list datasets NAME --details``):

>>> print(format_options("yeast"))  # doctest: +ELLIPSIS
yeast: MULAN yeast (river): ...
  path (str | os.PathLike | None, default None)
      a yeast.csv / yeast.csv.gz with Att* and Class* columns (default: the copy inside ...
  ...
"""
from __future__ import annotations

import difflib
import inspect
import os
from typing import Sequence

import numpy as np

from .registry import DATASETS

#: ``load_splits`` options that belong to the protocol (`make_splits`),
#: not to the source
PROTOCOL_OPTIONS = ("subsample", "subsample_seed", "class_order", "protocol", "val_variant")
# a source of its own may not take them: load_splits keeps them for make_splits
DATASETS.reserved.update({key: "a protocol option load_splits takes for every source"
                          for key in PROTOCOL_OPTIONS})
#: options every image source takes besides its own: its items become a backbone's cached
#: features (`spmlkit.loading.load_feature_dataset`)
FEATURE_KEYS = ("backbone", "features")

#: annotation names -> the Python types a value may have; an annotation with any other name is
#: not checked (a sequence, a mapping, a callable...)
_TYPES = {
    "int": (int, np.integer), "float": (int, float, np.integer, np.floating),
    "bool": (bool, np.bool_), "str": (str,), "None": (type(None),),
    "os.PathLike": (os.PathLike,), "PathLike": (os.PathLike,), "Path": (os.PathLike,),
    "np.ndarray": (np.ndarray,), "dict": (dict,), "list": (list, tuple),
}


#: what an options error adds (formatted with the dataset's name)
DETAILS_HINT = "spml list datasets {} --details: each option's type, default and meaning"


def args_section(doc: str | None) -> dict[str, str]:
    """``{parameter: description}`` from the ``Args:`` section of a Google-style docstring;
    an entry naming several parameters (``skip_missing, skip_corrupt: ...``) gives each the
    text; continuation lines are joined.

    >>> args_section("Do.\\n\\nArgs:\\n    a, b: two\\n        lines.\\n    c: x\\n\\nReturns: y")
    {'a': 'two lines.', 'b': 'two lines.', 'c': 'x'}
    """
    out: dict[str, str] = {}
    if not doc:
        return out
    lines = inspect.cleandoc(doc).splitlines()
    try:
        start = next(i for i, line in enumerate(lines) if line.strip() == "Args:")
    except StopIteration:
        return out
    names: list[str] = []
    indent = None
    for line in lines[start + 1:]:
        if not line.strip():
            if names:
                names = []  # a blank line ends the section
                break
            continue
        width = len(line) - len(line.lstrip())
        if indent is None:
            indent = width
        if width < indent:
            break
        head, sep, text = line.strip().partition(":")
        keys = [k.strip().lstrip("*") for k in head.split(",")]
        if width == indent and sep and all(k.isidentifier() for k in keys):
            names = keys
            for k in names:
                out[k] = text.strip()
        elif names:
            for k in names:
                out[k] = f"{out[k]} {line.strip()}".strip()
    return out


def _annotation(p: inspect.Parameter) -> str:
    if p.annotation is p.empty:
        return "any"
    return p.annotation if isinstance(p.annotation, str) else \
        getattr(p.annotation, "__name__", str(p.annotation))


def parameter_rows(params, doc, group: str, keep=None) -> list[dict]:
    """One row per keyword parameter in ``params`` (an ``inspect`` signature's parameters,
    limited to ``keep`` when given), described by the ``Args:`` section of ``doc``: the rows of
    `describe_options`."""
    docs = args_section(doc)
    rows = []
    for key, p in params.items():
        if keep is not None and key not in keep:
            continue
        if p.kind not in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
            continue
        required = p.default is p.empty
        rows.append({"name": key, "type": _annotation(p), "required": required,
                     "default": None if required else repr(p.default),
                     "help": docs.get(key, ""), "group": group})
    return rows


def describe_options(name: str, feature_rows: Sequence[dict] = ()) -> list[dict]:
    """Every option the dataset ``name`` takes, from signatures and docstrings: its own
    (the source function's), the protocol's (`PROTOCOL_OPTIONS`, from
    `make_splits`) and, for an image source, ``feature_rows``
    (`FEATURE_KEYS`, described by `spmlkit.loading.feature_option_rows`, which
    sits above this module).

    Returns:
        ``[{"name", "type", "default", "required", "help", "group"}]`` in that order;
        ``default`` is the ``repr`` of the default (``None`` when required), ``group`` one of
        ``"source"``, ``"protocol"``, ``"features"``.

    Raises:
        ValueError: an unknown dataset.
    """
    from .protocol import make_splits

    entry = DATASETS.get(name)
    # ``seed`` given with the options (--data seed=N, a study's data.seed) is load_splits' own:
    # the observed labels' draw; a source's ``seed`` is load_dataset(name, seed=N)'s only
    own = {k: p for k, p in source_parameters(name).items() if k != "seed"}
    rows = parameter_rows(own, inspect.getdoc(entry.factory), "source")
    rows += parameter_rows(inspect.signature(make_splits).parameters,
                           inspect.getdoc(make_splits), "protocol", ("seed", *PROTOCOL_OPTIONS))
    if "images" in entry.tags:
        rows += list(feature_rows)
    return rows


def _plain_text(text: str) -> str:
    """A docstring fragment without its reST markup (``x``, `x`, `b`)."""
    import re

    text = re.sub(r":[a-z]+:`~?([^`]+)`", lambda m: m.group(1).rsplit(".", 1)[-1]
                  if m.group(0).count("~") else m.group(1), text)
    return text.replace("``", "")


def format_options(name: str, width: int = 100, feature_rows: Sequence[dict] = ()) -> str:
    """`describe_options` as the text ``spml list datasets NAME --details`` prints: per
    option a line ``name (type, default)`` and its description below it."""
    import textwrap

    entry = DATASETS.get(name)
    titles = {"protocol": "the protocol's (train / val split), every source takes them",
              "features": "an image source trained on a backbone's cached features"}
    lines = [f"{entry.name}: {entry.description}"]
    group = "source"
    for r in describe_options(name, feature_rows):
        if r["group"] != group:
            group = r["group"]
            lines.append(f"  -- {titles[group]}")
        default = "required" if r["required"] else f"default {r['default']}"
        lines.append(f"  {r['name']} ({r['type']}, {default})")
        text = _plain_text(r["help"]) or "(not documented)"
        lines.extend(textwrap.wrap(text, width, initial_indent=" " * 6,
                                   subsequent_indent=" " * 6, break_long_words=False))
    return "\n".join(lines)


def source_parameters(name: str) -> dict[str, inspect.Parameter]:
    """The keyword parameters of the registered source ``name`` (by its signature)."""
    factory = DATASETS.get(name).factory
    return {n: p for n, p in inspect.signature(factory).parameters.items()
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}


def path_options(name: str) -> set[str]:
    """The options of the registered source ``name`` that take a file or folder (annotated
    ``os.PathLike``); empty for a name no source is registered under."""
    try:
        params = source_parameters(name)
    except ValueError:
        return set()
    return {n for n, p in params.items() if "PathLike" in str(p.annotation)}


def _accepts(annotation: str, value) -> bool | None:
    """Whether ``value`` fits an annotation written as text (``"int"``, ``"str | None"``);
    ``None`` when the annotation names a type this check does not know."""
    allowed = []
    for token in annotation.replace("Optional[", "").replace("]", "").split("|"):
        token = token.strip()
        if token not in _TYPES:
            return None
        allowed.append(token)
    for token in allowed:
        if token in ("int", "float") and isinstance(value, (bool, np.bool_)):
            continue  # True is an int to Python, not to a user
        if isinstance(value, _TYPES[token]):
            return True
    return False


def check_source_options(name: str, options: dict, protocol: Sequence[str] = (), *,
                         complete: bool = True) -> None:
    """Check ``options`` for the source ``name`` before calling it.

    Args:
        name: a registered dataset (an unknown one raises the registry's error).
        options: the keyword options meant for the source; besides the source's own parameters,
            `FEATURE_KEYS` are accepted (image sources) and so are ``protocol``.
        protocol: further accepted keys, handled by the caller (``load_splits`` passes
            `PROTOCOL_OPTIONS`).
        complete: whether ``options`` are all the source gets (then a required parameter that
            is missing is an error); ``False`` checks only the keys and values given.

    Raises:
        ValueError: an unknown key (with the closest known one and the full list), a required
            parameter missing, or a value whose type the parameter's annotation excludes; the
            message names the dataset, the key and the value.
    """
    params = source_parameters(name)
    entry = DATASETS.get(name)
    images = "images" in entry.tags
    takes = [*params, *protocol, *(FEATURE_KEYS if images else ())]
    for key in options:
        if key in takes or key in FEATURE_KEYS:
            continue
        if key in PROTOCOL_OPTIONS:
            raise ValueError(f"option {key!r} belongs to the train / val protocol "
                             f"(load_splits: spml train, benchmark, study), not to the source "
                             f"of dataset {entry.name!r}; it takes: {', '.join(takes)}")
        close = difflib.get_close_matches(key, [*takes, *PROTOCOL_OPTIONS], n=1)
        hint = f"; did you mean {close[0]!r}? It takes: " if close else "; it takes: "
        raise ValueError(f"unknown option {key!r} for dataset {entry.name!r}{hint}"
                         f"{', '.join(takes)} ({DETAILS_HINT.format(entry.name)})")
    missing = [n for n, p in params.items() if p.default is p.empty and n not in options] \
        if complete else []
    if missing:
        raise ValueError(f"dataset {entry.name!r} needs the option(s) {', '.join(missing)} "
                         f"(e.g. --data {missing[0]}=...); it takes: {', '.join(takes)} "
                         f"({DETAILS_HINT.format(entry.name)})")
    for key, value in options.items():
        p = params.get(key)
        if p is None or p.annotation is p.empty or (value is None and p.default is None):
            continue
        annotation = p.annotation if isinstance(p.annotation, str) else \
            getattr(p.annotation, "__name__", str(p.annotation))
        if _accepts(annotation, value) is False:
            hint = ""
            if isinstance(value, (int, float)) and _accepts(annotation, "text"):
                hint = " (on the command line a number is read as one: write a path as ./NAME)"
            raise ValueError(f"option {key}={value!r} of dataset {entry.name!r}: expected "
                             f"{annotation}, got {type(value).__name__}{hint}")
