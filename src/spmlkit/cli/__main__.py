"""``python -m spmlkit.cli ...`` runs the ``spml`` command line."""
import sys

from . import run

sys.exit(run())
