"""The `splitbrain` command, one module per subcommand."""

from detector.cli.main import main

__all__ = ["main"]
