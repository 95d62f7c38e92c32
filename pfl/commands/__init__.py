"""Subcommands of ``python -m pfl`` besides ``fit``."""
