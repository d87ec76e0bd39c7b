"""Deprecated spelling of `python -m nanoexp.experiment.report.compare`, kept for one release."""

import sys

if __name__ == "__main__":
    print(
        "nanoexp: warning: `python -m nanoexp.experiment.compare` is deprecated; "
        "use `python -m nanoexp.experiment.report.compare`",
        file=sys.stderr,
    )
    from nanoexp.experiment.report.compare import cli

    sys.exit(cli())
