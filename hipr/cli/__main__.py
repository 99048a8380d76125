"""``python -m hipr.cli``: the ``hipr`` command."""

import sys

from hipr.cli import main

sys.exit(main())
