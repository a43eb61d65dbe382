"""The findings table of the committed results (`noisy_student_assets.core.reporting.findings`), from the command line.

python -m noisy_student_assets.findings            # print it and the README's headline, from results/
python -m noisy_student_assets.findings --write    # and copy them into README.md (and the table into docs/results.md)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from noisy_student_assets.core.reporting.findings import (
    HEADLINE_BEGIN,
    HEADLINE_END,
    findings,
    findings_markdown,
    headline,
    with_findings,
)
from noisy_student_assets.core.reporting.markdown import with_block

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
PAGES = (README, REPO / "docs" / "results.md")
"""The pages that show the findings table between its markers; the README also its headline."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lake", type=Path, default=REPO / "results", help="the results directory (default: results)")
    parser.add_argument(
        "--write", action="store_true", help="copy the table into " + " and ".join(p.name for p in PAGES)
    )
    args = parser.parse_args(argv)
    table = findings_markdown(findings(args.lake, REPO / "experiments"))
    lead = headline(args.lake, REPO / "experiments")
    print(lead, table, sep="\n\n")
    if args.write:
        for page in PAGES:
            page.write_text(with_findings(page.read_text(), table))
            print(f"written: {page}")
        README.write_text(with_block(README.read_text(), lead, HEADLINE_BEGIN, HEADLINE_END))
    return 0


if __name__ == "__main__":
    sys.exit(main())
