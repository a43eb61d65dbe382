"""What the explorer offers of a lake (`core.lake_reader`, `core.reporting.inspection`): every checkpoint the lake
holds and nothing half written, and links to a round's view that open on the view they name."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import parse_qsl, urlsplit

from noisy_student_assets.core import environment, layout
from noisy_student_assets.core.lake_reader import CHECKPOINT_CONFIG, lake_checkpoints
from noisy_student_assets.core.reporting.inspection import explorer_link, linked_view


def _checkpoint(directory: Path) -> None:
    directory.mkdir(parents=True)
    (directory / CHECKPOINT_CONFIG).write_text("{}")


def test_every_materialized_checkpoint_is_offered_by_arm_and_round(tmp_path: Path) -> None:
    for arm in ("b", "a"):
        _checkpoint(layout.artifact_dir(tmp_path, layout.BASE_MODEL, arm))
        _checkpoint(layout.artifact_dir(tmp_path, layout.LABELED_RL, arm))
        for number in (2, 1):
            _checkpoint(layout.artifact_dir(tmp_path, layout.round_asset(number, layout.STUDENT), arm))
    _checkpoint(
        layout.artifact_dir(tmp_path, layout.round_asset(1, layout.control_checkpoint(layout.LABELED_ONLY)), "a")
    )
    # Being written: no config yet.
    layout.artifact_dir(tmp_path, layout.round_asset(1, layout.control_checkpoint(layout.GOLD_LABEL)), "a").mkdir(
        parents=True
    )

    checkpoints = lake_checkpoints(tmp_path)
    assert list(checkpoints) == [
        "a / base model",
        "a / labeled RL",
        "a / round 1 / student",
        "a / round 1 / labeled_only",
        "a / round 2 / student",
        "b / base model",
        "b / labeled RL",
        "b / round 1 / student",
        "b / round 2 / student",
    ]
    assert checkpoints["a / round 1 / labeled_only"] == layout.artifact_dir(
        tmp_path, layout.round_asset(1, "labeled_only_checkpoint"), "a"
    )


def test_an_empty_lake_offers_no_checkpoint(tmp_path: Path) -> None:
    assert lake_checkpoints(tmp_path) == {}


def test_a_link_opens_on_the_view_it_names(monkeypatch) -> None:
    monkeypatch.setenv(environment.EXPLORER_URL, "http://explorer.example:8080/")
    link = explorer_link("default", 2, "pool-17 & more")
    assert link.startswith("http://explorer.example:8080/?")
    assert linked_view(dict(parse_qsl(urlsplit(link).query))) == ("default", 2, "pool-17 & more")

    monkeypatch.delenv(environment.EXPLORER_URL)
    round_only = explorer_link("a", 1)
    assert round_only == "http://127.0.0.1:7860/?arm=a&round=1"
    assert linked_view(dict(parse_qsl(urlsplit(round_only).query))) == ("a", 1, None)
    assert linked_view({"round": "one"}) == (None, None, None)
