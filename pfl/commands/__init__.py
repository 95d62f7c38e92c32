"""Sub-commands of ``python -m pfl`` that live outside pfl/cli.py."""
