"""``python -m pyptx``: the ``pyptx`` command."""

import sys

from .cli import main

sys.exit(main())
