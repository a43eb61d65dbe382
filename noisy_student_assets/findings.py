"""The findings table of the committed results (`noisy_student_assets.core.reporting.findings`), from the command line.

python -m noisy_student_assets.findings            # print it, from results/
python -m noisy_student_assets.findings --write    # and copy it into README.md and docs/results.md
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from noisy_student_assets.core.reporting.findings import findings, findings_markdown, with_findings

REPO = Path(__file__).resolve().parents[1]
PAGES = (REPO / "README.md", REPO / "docs" / "results.md")
"""The pages that show the findings table between its markers."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lake", type=Path, default=REPO / "results", help="the results directory (default: results)")
    parser.add_argument(
        "--write", action="store_true", help="copy the table into " + " and ".join(p.name for p in PAGES)
    )
    args = parser.parse_args(argv)
    table = findings_markdown(findings(args.lake, REPO / "experiments"))
    print(table)
    if args.write:
        for page in PAGES:
            page.write_text(with_findings(page.read_text(), table))
            print(f"written: {page}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
