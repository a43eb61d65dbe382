"""What a materialization was made of (`defs/lineage.py`) and which assets the grid redoes (`core/staleness.py`), and
the code versions that make the UI show exactly those as unsynced."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import dagster as dg
import pytest

from noisy_student_assets.core import layout
from noisy_student_assets.core.settings import PseudoLabelSettings, StudentSettings
from noisy_student_assets.core.staleness import Recorded, fingerprint, stale_assets
from noisy_student_assets.defs.lineage import recorded, reuse_key
from tests.cli import changed_defaults_env

TARGETS = ["split", "labeled_rl", "generations", "pseudo_labels", "student"]
PARENTS = {
    "split": ["pool"],
    "labeled_rl": ["split", "base_model"],
    "generations": ["labeled_rl"],
    "pseudo_labels": ["generations"],
    "student": ["pseudo_labels", "labeled_rl"],
}
STAGES = {name: f"{name}@1" for name in TARGETS}
SETTINGS = {name: {"config": {"seed": 0}} for name in TARGETS}
SETTINGS["generations"] = {"config": {"k": 8, "temperature": 0.6}, "compute": {"device": "cpu"}}
OUTSIDE = {"pool": "pool-v1", "base_model": "base-v1"}


def made_as_now(settings: dict = SETTINGS, outside: dict = OUTSIDE) -> dict[str, Recorded]:
    """The records of a lake made with `settings` from the assets outside the targets at `outside`'s data versions,
    each data version its fingerprint (as the pipeline records them)."""
    records = {name: Recorded(version, version, {}, None) for name, version in outside.items()}
    for name in TARGETS:
        version = fingerprint(
            STAGES[name], settings[name], {parent: records[parent].data_version for parent in PARENTS[name]}
        )
        records[name] = Recorded(version, version, settings[name], STAGES[name])
    return records


def test_nothing_is_redone_when_nothing_changed() -> None:
    assert stale_assets(TARGETS, PARENTS, STAGES, SETTINGS, made_as_now()) == {}


def test_missing_assets_and_everything_downstream_are_redone() -> None:
    latest = made_as_now() | {"generations": None}
    assert list(stale_assets(TARGETS, PARENTS, STAGES, SETTINGS, latest)) == ["generations", "pseudo_labels", "student"]
    assert list(stale_assets(TARGETS, PARENTS, STAGES, SETTINGS, {})) == TARGETS


def test_a_changed_setting_redoes_its_stage_and_what_follows_not_what_precedes() -> None:
    changed = SETTINGS | {"generations": {"config": {"k": 6, "temperature": 0.6}, "compute": {"device": "cpu"}}}
    stale = stale_assets(TARGETS, PARENTS, STAGES, changed, made_as_now())
    assert list(stale) == ["generations", "pseudo_labels", "student"]
    assert stale["generations"] == "settings changed: config.k: 8 -> 6"
    assert stale["pseudo_labels"] == "input generations redone"


def test_another_compute_device_redoes_the_heavy_stage() -> None:
    changed = SETTINGS | {"generations": SETTINGS["generations"] | {"compute": {"device": "cuda"}}}
    stale = stale_assets(TARGETS, PARENTS, STAGES, changed, made_as_now())
    assert stale["generations"] == 'settings changed: compute.device: "cpu" -> "cuda"'


def test_a_raised_stage_version_redoes_its_stage_and_what_follows() -> None:
    stale = stale_assets(TARGETS, PARENTS, STAGES | {"pseudo_labels": "pseudo_labels@2"}, SETTINGS, made_as_now())
    assert stale == {
        "pseudo_labels": "stage version pseudo_labels@1 -> pseudo_labels@2",
        "student": "input pseudo_labels redone",
    }


def test_an_input_with_another_data_version_redoes_what_reads_it() -> None:
    latest = made_as_now() | {"base_model": Recorded("base-v2", "base-v2", {}, None)}
    stale = stale_assets(TARGETS, PARENTS, STAGES, SETTINGS, latest)
    assert list(stale) == ["labeled_rl", "generations", "pseudo_labels", "student"]
    assert stale["labeled_rl"] == "an input has another data version than it was made from"


def test_an_identical_rematerialization_of_an_input_redoes_nothing() -> None:
    """Its data version is its fingerprint, the same as before: what reads it is still current (a later timestamp
    alone does not make it stale)."""
    assert (
        stale_assets(
            TARGETS, PARENTS, STAGES, SETTINGS, made_as_now() | {"pool": Recorded("pool-v1", "pool-v1", {}, None)}
        )
        == {}
    )


class _Record:
    """An `EventLogRecord` as `recorded` reads it."""

    def __init__(self, metadata: dict, tags: dict, storage_id: int = 7) -> None:
        self.storage_id = storage_id
        self.asset_materialization = dg.AssetMaterialization("x", metadata=metadata, tags=tags)


def test_a_lake_made_before_fingerprints_is_current_when_its_config_is_unchanged() -> None:
    """Its data versions are Dagster's own; its fingerprint is rebuilt from its `config` metadata and the input
    materializations Dagster recorded it read, so nothing is redone until a setting or an input changes."""
    config = {"k": 8, "temperature": 0.6}
    tags = {
        "dagster/data_version": "dagster-own",
        "dagster/code_version": "run-1",
        # Dagster's own form of a partitioned input's version, which is not the input's data version
        "dagster/input_data_version/teacher": "dagster-partitioned-form",
        "dagster/input_event_pointer/teacher": "41",
    }
    record = _Record({"config": dg.MetadataValue.json(config)}, tags)
    before = recorded(record, "TeacherSamplingSettings@1", {"device": "cpu"}, {"teacher": (41, "teacher-v")})
    settings = {"config": config, "profile": "cpu", "compute": {"device": "cpu"}}
    assert before.data_version == "dagster-own" and before.stage_version is None
    assert before.fingerprint == fingerprint("TeacherSamplingSettings@1", settings, {"teacher": "teacher-v"})
    latest = {"teacher": Recorded("teacher-v", "teacher-v", {}, None), "generations": before}
    stages = {"generations": "TeacherSamplingSettings@1"}
    assert stale_assets(["generations"], {"generations": ["teacher"]}, stages, {"generations": settings}, latest) == {}
    changed = {"generations": settings | {"config": config | {"k": 6}}}
    assert stale_assets(["generations"], {"generations": ["teacher"]}, stages, changed, latest) == {
        "generations": "settings changed: config.k: 8 -> 6"
    }
    retrained = recorded(record, "TeacherSamplingSettings@1", {"device": "cpu"}, {"teacher": (57, "teacher-v")})
    assert retrained.fingerprint != before.fingerprint, "a teacher materialized again after the samples were drawn"


def test_a_recorded_fingerprint_is_read_back_as_it_was_set() -> None:
    tags = {"dagster/data_version": "fp", "dagster/code_version": "c", "dagster/data_version_is_user_provided": "true"}
    again = recorded(_Record({"config": dg.MetadataValue.json({}), "stage_version": "S@1"}, tags), "S@2", None, {})
    assert again == Recorded("fp", "fp", {"config": {}, "profile": "cpu"}, "S@1")


def test_reuse_keys_stay_those_of_the_content_at_version_one_and_change_with_a_raised_version(monkeypatch) -> None:
    monkeypatch.setattr(PseudoLabelSettings, "stage_version", 1)
    assert reuse_key("abc", PseudoLabelSettings()) == "abc"
    monkeypatch.setattr(StudentSettings, "stage_version", 3)
    assert reuse_key("abc", StudentSettings()) not in ("abc", reuse_key("abc", PseudoLabelSettings()))


def _code_versions(defaults: dict) -> dict[str, str]:
    """The code location's code versions, loaded in a fresh interpreter with some settings' defaults changed
    ({"TeacherSamplingSettings": {"k": 6}}), as an edited `core/settings.py` would load."""
    script = (
        "import json, sys\n"
        "from noisy_student_assets.defs.code_location import defs\n"
        "graph = defs.resolve_asset_graph()\n"
        "versions = {key.to_user_string(): graph.get(key).code_version for key in graph.get_all_asset_keys()}\n"
        "json.dump(versions, sys.stdout)\n"
    )
    env = os.environ | changed_defaults_env(defaults)
    run = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", script], capture_output=True, text=True, timeout=300, check=True, env=env
    )
    return json.loads(run.stdout)


@pytest.fixture(scope="module")
def code_versions() -> dict[str, str]:
    return _code_versions({})


def test_every_asset_has_a_code_version(code_versions) -> None:
    assert all(code_versions.values()) and len(code_versions) > 20


def test_a_changed_default_k_changes_the_code_version_of_generations_and_what_follows_only(code_versions) -> None:
    changed = _code_versions({"TeacherSamplingSettings": {"k": 6}})
    differ = {key for key in code_versions if changed[key] != code_versions[key]}
    generations = "/".join(layout.round_asset(1, layout.GENERATIONS))
    assert generations in differ
    assert not differ & {
        layout.PROBLEM_POOL,
        layout.BASE_MODEL,
        layout.LABELED_PROBLEMS,
        layout.LABELED_RL,
        layout.LABELED_RL_EVAL,
    }
    downstream = {
        "/".join(layout.round_asset(n, name))
        for n in (1, 2)
        for name in (layout.PSEUDO_LABELS, layout.STUDENT, layout.EVAL_REPORT)
    }
    assert downstream <= differ
    labeled_only = "/".join(layout.round_asset(1, layout.control_checkpoint(layout.LABELED_ONLY)))
    assert labeled_only in differ, "the labeled-only control's completion cap comes from the teacher's samples"


def test_a_setting_added_at_the_behaviour_from_before_it_changes_no_fingerprint() -> None:
    """`grpo.completion_cap_margin` null is the fixed cap, what every stage did before the field existed: its dump
    leaves it out, so labeled RL's run config (which a fingerprint and a code version cover) is the one recorded
    before; a round's student and controls cap by default, so theirs has it."""
    from noisy_student_assets.core.settings import COMPLETION_CAP_MARGIN, LabeledRLSettings
    from noisy_student_assets.defs.config import LabeledOnlyConfig, LabeledRLConfig, StudentConfig

    for dumped in (LabeledRLSettings().model_dump(), LabeledRLConfig().model_dump()):
        assert "completion_cap_margin" not in dumped["grpo"] and "max_completion_length" in dumped["grpo"]
    for dumped in (StudentSettings().model_dump(), StudentConfig().model_dump(), LabeledOnlyConfig().model_dump()):
        assert dumped["grpo"]["completion_cap_margin"] == COMPLETION_CAP_MARGIN


def test_a_default_arm_made_with_the_fixed_step_teacher_redoes_labeled_rl_saying_what_changed() -> None:
    """The default teacher trains until its validation accuracy stalls within 96 steps, where it trained 6 (the
    teacher that experiments pinning `labeled_rl_steps: 6` and `labeled_rl_validation_every: 0` keep): a default arm
    made with the 6-step teacher redoes labeled RL and what reads it, and `grid plan` names the two settings; the
    pinned arm redoes nothing."""
    from noisy_student_assets.core.experiments.arms import LABELED_RL, Arm, ArmSpec
    from noisy_student_assets.core.settings import resolved

    def teacher(spec: ArmSpec) -> dict:
        return {"config": resolved(Arm(name="a", experiment="e", spec=spec).spec.settings(LABELED_RL))}

    pinned = SETTINGS | {"labeled_rl": teacher(ArmSpec(seed=0, labeled_rl_steps=6, labeled_rl_validation_every=0))}
    assert stale_assets(TARGETS, PARENTS, STAGES, pinned, made_as_now(pinned)) == {}
    now = SETTINGS | {"labeled_rl": teacher(ArmSpec(seed=0))}
    stale = stale_assets(TARGETS, PARENTS, STAGES, now, made_as_now(pinned))
    assert stale == {
        "labeled_rl": "settings changed: config.grpo.max_steps: 6 -> 96; config.grpo.validation_every: null -> 8",
        "generations": "input labeled_rl redone",
        "pseudo_labels": "input generations redone",
        "student": "input pseudo_labels, labeled_rl redone",
    }
