"""`kvscale` command line: plan, predict (and, as they land, run and simulate)."""

from kvscale.cli.main import main

__all__ = ["main"]
