"""Copy the latest `make benchmark` results into docs/benchmark.md, between its markers, so that the page shows what
the last run measured with its date and commit: the round's benchmark (`benchmarks/results/<profile>.md`) and the
GRPO step's (`benchmarks/results/grpo_memory.md`).

    .venv/bin/python -m benchmarks.publish [profile]    # default: the active profile
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "benchmark.md"
BEGIN, END = "<!-- make benchmark: begin -->", "<!-- make benchmark: end -->"


def block(profile: str) -> str:
    results = REPO / "benchmarks" / "results"
    return "\n".join(
        [
            BEGIN,
            "### The round",
            "",
            (results / f"{profile}.md").read_text().strip(),
            "",
            "### A GRPO step",
            "",
            (results / "grpo_memory.md").read_text().strip(),
            END,
        ]
    )


def publish(page: str, profile: str) -> str:
    """`page` with the text between its markers replaced by the results of `profile`."""
    from noisy_student_assets.core.reporting.markdown import with_block

    return with_block(page, block(profile), BEGIN, END)


def main() -> None:
    from noisy_student_assets.core.profiles import active_profile

    profile = sys.argv[1] if len(sys.argv) > 1 else active_profile()
    PAGE.write_text(publish(PAGE.read_text(), profile))
    print(f"written: {PAGE} (the results of profile {profile})")


if __name__ == "__main__":
    main()
