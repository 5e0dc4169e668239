"""How to install an optional part of spmlkit, said the same way by every error that needs one.

spmlkit is not on PyPI: its extras install from a clone of the repository (``pip install -e
".[tabular]"`` in the clone's folder), or from a wheel built there (``python -m build``) with
``pip install "spmlkit-<version>-py3-none-any.whl[tabular]"``. The packages an extra adds can
also be installed by name.
"""
from __future__ import annotations


def install_hint(extra: str, packages: str) -> str:
    """``extra``'s install line for an error message; ``packages``: the same by package name.

    >>> install_hint("tabular", "pandas pyarrow")  # doctest: +NORMALIZE_WHITESPACE
    'pip install -e ".[tabular]" in a clone of the spmlkit repository
     (or: pip install pandas pyarrow)'
    """
    return (f'pip install -e ".[{extra}]" in a clone of the spmlkit repository '
            f"(or: pip install {packages})")
