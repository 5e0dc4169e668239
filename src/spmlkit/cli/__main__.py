"""``python -m spmlkit.cli ...`` runs the ``spml`` command line."""
import sys

from . import main

sys.exit(main())
