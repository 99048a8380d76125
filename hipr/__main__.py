"""``python -m hipr``: the same as the ``hipr`` command."""

from hipr.cli import main

if __name__ == "__main__":  # imported (by documentation tools, say), it runs nothing
    raise SystemExit(main())
