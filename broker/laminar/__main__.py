"""`python -m laminar` runs the `laminar` command."""

import sys

from .cli import main

sys.exit(main())
