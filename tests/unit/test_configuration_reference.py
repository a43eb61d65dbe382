"""The configuration reference is generated from the settings, and the committed page is the generated one."""

from pathlib import Path

from noisy_student_assets.defs.reference import OUTPUT, render

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_the_committed_configuration_reference_is_what_the_code_generates() -> None:
    committed = (REPO_ROOT / OUTPUT).read_text()
    assert committed == render(), f"{OUTPUT} is out of date: run `make docs`"


def test_the_reference_gives_both_profiles_defaults_and_every_arm_field() -> None:
    page = (REPO_ROOT / OUTPUT).read_text()
    assert "| `grpo.max_steps` | `96` | `200` | optimizer steps |" in page  # labeled RL's own default
    assert "| `samples` | `0` | `8` |" in page  # the eval's samples on cpu and gpu
    for field in ("seed", "tau", "round_steps", "dropout", "mode"):
        assert f"| `{field}` |" in page
