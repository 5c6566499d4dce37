"""Subcommands of the ``bayesurl`` CLI, one module each (see :mod:`bayesurl.cli`)."""
