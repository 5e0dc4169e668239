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


def _where(obj) -> str:
    """``module.name`` of a registered class or function."""
    return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', obj)}"


class Registry:
    """Name -> `Entry`. ``register`` is used as a decorator on a class or function.

    ``reserved``: parameter names a registered factory may not take (name -> what takes that
    name instead), refused at registration: the caller's own keyword of that name would never
    reach the factory."""

    def __init__(self, kind: str, reserved: dict[str, str] | None = None):
        self.kind = kind
        self.reserved = dict(reserved or {})
        self._entries: dict[str, Entry] = {}
        self._aliases: dict[str, str] = {}

    def register(self, name: str, description: str, *, paper: str = "", defaults=None,
                 dataset_defaults=None, tags=(), aliases=(), factory=None):
        def deco(obj):
            for key in (name, *aliases):
                if key in self._entries or key in self._aliases:
                    first = self._entries[self._aliases.get(key, key)].factory
                    raise ValueError(f"{self.kind} {key!r} is registered twice: by "
                                     f"{_where(first)} and by {_where(obj)}; give one of them "
                                     f"another name")
            if self.reserved:
                import inspect

                try:
                    params = inspect.signature(obj).parameters
                except (TypeError, ValueError):
                    params = {}
                clash = [p for p in params if p in self.reserved]
                if clash:
                    raise ValueError(f"{self.kind} {name!r} ({_where(obj)}) takes a parameter "
                                     f"named {clash[0]!r}, which is {self.reserved[clash[0]]}: "
                                     f"its value would never reach it; name it otherwise")
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
