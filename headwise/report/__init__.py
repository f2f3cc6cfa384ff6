"""Reports: the run's JSON report, its HTML page (figures, the attention viewer), and the
terminal summary (docs/report.md)."""

from headwise.report.build import (
    build_report,
    expected_vs_observed,
    print_report,
    render_html,
    write_report,
)

__all__ = ["build_report", "expected_vs_observed", "print_report", "render_html", "write_report"]
