"""Jobs over the code location's assets."""

import dagster as dg

from noisy_student_assets.core import layout
from noisy_student_assets.core.experiments.progress import AskedFor
from noisy_student_assets.core.settings import RUN_TIME_LIMIT_S
from noisy_student_assets.defs.partitions import ARMS, ASKED_FOR, VERDICT_GROUP, round_group, round_key

ARM_JOB = "arm_job"
MAX_RUNTIME_TAG = "dagster/max_runtime"
RUN_TAGS = {MAX_RUNTIME_TAG: str(RUN_TIME_LIMIT_S)}
"""Every job's runs (launched from the UI, by the sensor, a job's backfill): run monitoring (dagster.yaml) stops one
past `RUN_TIME_LIMIT_S`. Job tags, not `run_tags`: a job's backfill gives its runs the job's tags alone. The grid's
runs, in its own process, have no daemon to stop them; their stages' limits do."""
STEP_PRELOAD = ["noisy_student_assets.definitions", "torch", "transformers", "trl.trainer.grpo_trainer", "vllm"]
"""What a run's step processes start with: the code location and the libraries its heavy stages import (vLLM, and
TRL's trainer, which also imports transformers' and vLLM's), imported once per run by the server its steps are
forked from, in place of once per step by a spawned interpreter. A run of light steps alone pays them once."""


def _forked_steps(config: dict) -> dict:
    """Dagster's default executor config, a process per step (`multiprocess`) started from a forkserver that
    preloaded `STEP_PRELOAD` unless the run names a start method; `in_process` as given."""
    if "multiprocess" not in config:
        return config
    forkserver = {"forkserver": {"preload_modules": STEP_PRELOAD}}
    return {
        "multiprocess": {
            **config["multiprocess"],
            "start_method": config["multiprocess"].get("start_method") or forkserver,
        }
    }


STEP_EXECUTOR = dg.multi_or_in_process_executor.configured(
    _forked_steps,
    config_schema=dg.Field(
        dg.multi_or_in_process_executor.config_schema.config_type, default_value={"multiprocess": {}}
    ),
)
"""Every job's executor, the implicit asset job's (`dagster asset materialize`, the UI) included: Dagster's
default with its step processes forked (`_forked_steps`); a run's `execution` config picks as it would there."""


def jobs(assets: dg.Definitions, rounds: int, asked_for: AskedFor = ASKED_FOR) -> dg.Definitions:
    """`arm_job`, up to three jobs per round (the round; its verifier and its validation, where `assets` has them and
    some arm does not run them) and `verdict_job` over `assets`."""
    verdict = dg.AssetSelection.groups(VERDICT_GROUP)
    defined_keys = {key for assets_def in assets.assets for key in assets_def.keys}
    round_jobs = []
    for number in range(1, rounds + 1):
        group = round_group(number)
        # Apart from the round's job, for the arms that read them: a verifier skipped for an arm whose label source
        # does not read it would skip the vote that reads its scores, and an evaluation cannot skip (its check would
        # go unreported).
        verifier = [
            key
            for name in (layout.VERIFIER, layout.VERIFIER_SCORES)
            if (key := round_key(number, name)) in defined_keys
        ]
        validation = [
            key
            for key in [round_key(number, layout.STUDENT_VALIDATION)]
            if key in defined_keys and not asked_for.every_arm_validated
        ]
        round_jobs.append(
            dg.define_asset_job(
                f"{group}_job",
                selection=dg.AssetSelection.groups(group)
                - dg.AssetSelection.assets(*verifier)
                - dg.AssetSelection.assets(*validation),
                partitions_def=ARMS,
                tags=RUN_TAGS,
                description=f"Round {number} of an arm: sample, pseudo-label, train the student and the controls its "
                "experiment lists, evaluate; a control it does not list skips."
                + (f" An arm whose label source reads a verifier runs {group}_verifier_job first." if verifier else "")
                + (
                    f" An arm with a patience or promoted on validation runs {group}_validation_job after."
                    if validation
                    else ""
                ),
            )
        )
        apart = {
            "verifier": (
                verifier,
                f"Round {number}'s outcome verifier and its scores of the round's samples: before {group}_job, for "
                "an arm whose label source reads them.",
            ),
            "validation": (
                validation,
                f"Round {number}'s student on the arm's validation problems: after {group}_job, for an arm whose "
                "stopping rule (a patience) or next round's promotion reads it.",
            ),
        }
        round_jobs += [
            dg.define_asset_job(
                f"{group}_{name}_job",
                selection=dg.AssetSelection.assets(*keys),
                partitions_def=ARMS,
                tags=RUN_TAGS,
                description=description,
            )
            for name, (keys, description) in apart.items()
            if keys
        ]
    defined = [
        dg.define_asset_job(
            ARM_JOB,
            selection=dg.AssetSelection.all() - verdict,
            partitions_def=ARMS,
            tags=RUN_TAGS,
            description="Everything of one arm: its task's problems, its base model, its split, labeled RL, every "
            "round and every control, with their evaluations.",
        ),
        *round_jobs,
        dg.define_asset_job(
            "verdict_job",
            selection=verdict,
            tags=RUN_TAGS,
            description="The verdict across every registered arm.",
        ),
    ]
    return dg.Definitions(jobs=defined, executor=STEP_EXECUTOR)
