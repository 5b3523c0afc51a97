"""`python -m volcano_locks ...` runs the `volcano-locks` command line."""

import sys

from .cli import main

sys.exit(main())
