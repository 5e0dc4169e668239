"""spmlkit: single-positive multi-label learning.

Every published single-positive method behind one loss contract, the Cole et al. protocol, a
fast linear-mode engine, a scikit-learn-style estimator and a command line (``spml``).

The names below are imported on first use (PEP 562), so ``import spmlkit.cli`` does not import
torch: the command line starts its worker processes' server first, while it imports the rest.
"""
import importlib

__version__ = "0.1.0"

#: the package's own names and the modules that define them
_EXPORTS = {"SPMLClassifier": ".estimator", "NEGATIVE": ".labels", "POSITIVE": ".labels",
            "UNOBSERVED": ".labels", "estimate_k": ".labels", "make_observed": ".labels",
            "create_loss": ".losses", "list_losses": ".losses"}

__all__ = ["NEGATIVE", "POSITIVE", "UNOBSERVED", "SPMLClassifier", "create_loss", "estimate_k",
           "list_losses", "make_observed", "__version__"]


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'spmlkit' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))
