"""Deprecated spelling of `python -m nanoexp.experiment.report.sweep_report`, kept for one release."""

import sys

if __name__ == "__main__":
    print(
        "nanoexp: warning: `python -m nanoexp.experiment.sweep_report` is deprecated; "
        "use `python -m nanoexp.experiment.report.sweep_report`",
        file=sys.stderr,
    )
    from nanoexp.experiment.report.sweep_report import cli

    sys.exit(cli())
