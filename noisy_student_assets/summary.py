"""`python -m noisy_student_assets.summary`: the run summary of the data lake (see
`noisy_student_assets.core.reporting.summary`)."""

from noisy_student_assets.core.reporting.summary import main

if __name__ == "__main__":
    main()
