"""``python -m searchr1`` runs the ``searchr1`` command."""

import sys

from searchr1.cli import main

sys.exit(main())
