"""The ``hipr`` command: one module per subcommand, helpers they share in ``common``.

``main`` is the console entry point (``hipr = "hipr.cli:main"``). It imports the
subcommands only when called, so importing this package stays cheap.
"""

from __future__ import annotations

from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``hipr`` command with ``argv`` (default: ``sys.argv[1:]``); the exit code."""
    from hipr.cli.app import main as run

    return run(argv)


__all__ = ["main"]
