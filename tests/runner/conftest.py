"""The fixture ``runs`` (tests/report_plots_helpers.py): three run folders for the report's figures."""

from tests.report_plots_helpers import runs  # noqa: F401
