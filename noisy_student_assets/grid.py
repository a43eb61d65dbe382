"""`python -m noisy_student_assets.grid register|run experiments/<name>.yaml`: an experiment's grid (see
`noisy_student_assets.defs.grid`)."""

import sys

from noisy_student_assets.defs.grid import main

if __name__ == "__main__":  # vLLM spawns worker processes that re-import the main module
    sys.exit(main())
