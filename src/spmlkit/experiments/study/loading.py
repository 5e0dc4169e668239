"""Reading a study spec: a YAML file, a study folder, a preset or a dict; ``--set`` overrides."""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

from .layout import PRESETS_DIR, SPEC_FILE
from .spec import StudySpec
from .validate import validate
from .yaml_text import parse_yaml, read_spec_text


def list_presets() -> list[tuple[str, str]]:
    """``(name, title)`` of every shipped preset (``spml study list``)."""
    out = []
    for path in sorted(PRESETS_DIR.glob("*.yaml")):
        try:
            raw = parse_yaml(path.read_text(), str(path)) or {}
            title = str(raw.get("title") or "") if isinstance(raw, dict) else ""
        except ValueError as err:
            title = f"(unreadable: {err})"
        out.append((path.stem, title))
    return out


def _set_dotted(raw: dict, key: str, value, where: str) -> None:
    parts = key.split(".")
    if parts[0] in ("vary", "grid") and len(parts) > 2:  # vary.hparams.alpha: one key
        parts = [parts[0], ".".join(parts[1:])]
    node = raw
    for part in parts[:-1]:
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise ValueError(f"{where}: cannot set {key!r}: {part!r} is not a mapping")
        node = child
    node[parts[-1]] = value


def apply_overrides(raw: dict, overrides, where: str = "--set") -> dict:
    """``raw`` with ``overrides`` set: a dict ``{"seeds": 1, "grid.lr": [1e-3]}`` or a list of
    ``key=value`` strings (values read as YAML: ``methods=[an, role]``)."""
    raw = json.loads(json.dumps(raw))  # a deep copy
    if isinstance(overrides, dict):
        items = list(overrides.items())
    else:
        items = []
        for item in overrides or ():
            key, sep, text = str(item).partition("=")
            if not sep or not key.strip():
                raise ValueError(f"{where}: expected key=value (e.g. seeds=1), got {item!r}")
            items.append((key.strip(), parse_yaml(text, f"{where} {key.strip()}")))
    for key, value in items:
        _set_dotted(raw, key, value, where)
    return raw


def load_study(path_or_preset, overrides=None) -> StudySpec:
    """Read and validate a study spec.

    Args:
        path_or_preset: a YAML file, a study folder (its ``study.yaml``), a preset name
            (``"cole-table1"``: ``presets/cole-table1.yaml``), a dict, or a `StudySpec`.
        overrides: see `apply_overrides` (``["seeds=1", "epochs=5"]``).

    Raises:
        FileNotFoundError: neither a file, a study folder nor a preset (the presets are listed).
        ValueError: the spec is not valid; the message names the file, the key and what is
            expected.
    """
    if isinstance(path_or_preset, StudySpec):
        if not overrides:
            return path_or_preset
        raw, source, stem = path_or_preset.to_dict(), path_or_preset.source, None
    elif isinstance(path_or_preset, dict):
        raw, source, stem = path_or_preset, "<dict>", None
    else:
        path = Path(path_or_preset)
        if path.is_dir() and (path / SPEC_FILE).is_file():
            path = path / SPEC_FILE
        elif not path.is_file():
            preset = PRESETS_DIR / f"{path_or_preset}.yaml"
            if path.suffix or os.sep in str(path_or_preset) or not preset.is_file():
                names = ", ".join(n for n, _ in list_presets()) or "none"
                raise FileNotFoundError(f"no study spec {str(path_or_preset)!r}: not a YAML file, "
                                        f"a study folder or a preset (presets: {names})")
            path = preset
        source, stem = str(path), path.stem if path.name != SPEC_FILE else path.parent.name
        raw = parse_yaml(read_spec_text(path), source)
    if not isinstance(raw, dict):
        raise ValueError(f"{source}: a study spec is a mapping of keys (name, datasets, methods, "
                         f"...), got {type(raw).__name__}")
    if overrides:
        raw = apply_overrides(raw, overrides)
        keys = overrides if isinstance(overrides, dict) else [o.split("=", 1)[0] for o in overrides]
        if "methods" in keys:
            _drop_orphan_hparams(raw)
    return validate(raw, source, stem)


def _drop_orphan_hparams(raw: dict) -> None:
    """After ``--set methods=...``: the spec's ``hparams`` of methods no longer in the study
    are dropped, with a warning (in a spec file such an entry is an error: a typo)."""
    import warnings

    hparams, methods = raw.get("hparams"), raw.get("methods")
    if not isinstance(hparams, dict) or not isinstance(methods, list):
        return
    names = set()
    for m in methods:
        spec = str(m.get("spec", "")) if isinstance(m, dict) else str(m)
        names |= {str(m.get("label")) if isinstance(m, dict) else spec,
                  re.split(r"[@+]", spec)[0]}
    for key in [k for k in hparams if k not in names]:
        warnings.warn(f"--set methods: hparams.{key} names no method of the study now; dropped",
                      stacklevel=3)
        del hparams[key]

