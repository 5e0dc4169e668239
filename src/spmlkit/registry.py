"""One small registry type, used for every kind of pluggable part (losses, datasets, ...).

Each entry carries what the CLI, the docs and the generated tests need: a one-line description,
the paper it comes from, default hyperparameters (optionally per dataset) and what it needs from
the engine.
"""
from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Any, Callable


@dataclass(frozen=True)
class Entry:
    name: str
    factory: Callable[..., Any]
    description: str
    paper: str = ""
    defaults: dict = field(default_factory=dict)
    dataset_defaults: dict = field(default_factory=dict)
    tags: tuple = ()
    aliases: tuple = ()

    def hparams_for(self, dataset: str | None = None) -> dict:
        """Default hyperparameters, with the per-dataset official values layered on top."""
        out = dict(self.defaults)
        if dataset is not None:
            out.update(self.dataset_defaults.get(dataset, {}))
        return out


class Registry:
    """Name -> `Entry`. ``register`` is used as a decorator on a class or function."""

    def __init__(self, kind: str):
        self.kind = kind
        self._entries: dict[str, Entry] = {}
        self._aliases: dict[str, str] = {}

    def register(self, name: str, description: str, *, paper: str = "", defaults=None,
                 dataset_defaults=None, tags=(), aliases=(), factory=None):
        def deco(obj):
            for key in (name, *aliases):
                if key in self._entries or key in self._aliases:
                    raise ValueError(f"{self.kind} {key!r} is registered twice")
            self._entries[name] = Entry(name, obj, description, paper, dict(defaults or {}),
                                        dict(dataset_defaults or {}), tuple(tags), tuple(aliases))
            self._aliases.update({a: name for a in aliases})
            return obj

        return deco(factory) if factory is not None else deco

    def get(self, name: str) -> Entry:
        try:
            return self._entries[self._aliases.get(name, name)]
        except KeyError:
            close = difflib.get_close_matches(str(name), [*self._entries, *self._aliases], n=3)
            hint = f" (did you mean {', '.join(close)}?)" if close else ""
            raise ValueError(f"unknown {self.kind} {name!r}{hint}; known: "
                             f"{', '.join(self._entries)}") from None

    def names(self, tag: str | None = None) -> list[str]:
        return [n for n, e in self._entries.items() if tag is None or tag in e.tags]

    def entries(self) -> list[Entry]:
        return list(self._entries.values())

    def __contains__(self, name) -> bool:
        return name in self._entries or name in self._aliases
