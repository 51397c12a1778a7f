"""``python -m privzo.cli``: the ``privzo`` command, as tests and jobs start it."""

import sys

from privzo.cli.entry import main

sys.exit(main())
