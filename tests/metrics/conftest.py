"""The fixture ``runs`` (tests/helpers/report_plots.py): three run folders for the report's figures."""

from tests.helpers.report_plots import runs  # noqa: F401
