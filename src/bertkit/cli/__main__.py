"""`python -m bertkit.cli` runs the bertkit command line."""

import sys

from bertkit.cli import main

sys.exit(main())
