"""``python -m hipr``: the same as the ``hipr`` command."""

from hipr.cli import main

raise SystemExit(main())
