"""``python -m hipr.cli``: the ``hipr`` command."""

import sys

from hipr.cli import main

if __name__ == "__main__":  # imported (by documentation tools, say), it runs nothing
    sys.exit(main())
