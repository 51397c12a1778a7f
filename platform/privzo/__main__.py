"""``python -m privzo``: the ``privzo`` command where its script is not installed."""

import sys

from privzo.cli import main

sys.exit(main())
