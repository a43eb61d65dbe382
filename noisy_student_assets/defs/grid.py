"""An experiment's grid, arms x rounds x controls, from the command line; resumable after a kill.

    python -m noisy_student_assets.grid register experiments/tau.yaml   # its arms become `arm` partitions
    python -m noisy_student_assets.grid plan experiments/tau.yaml       # what `run` would redo, and why (with
                                        # the same --arm, --through and --rounds, what that run would)
    python -m noisy_student_assets.grid run experiments/tau.yaml        # register, then materialize what is missing
    python -m noisy_student_assets.grid run experiments/tau.yaml --rounds 1   # every arm's round 1 first
    python -m noisy_student_assets.grid run experiments/tau.yaml --arm tau50-seed0   # one arm (and the verdict)
    python -m noisy_student_assets.grid run experiments/tau.yaml --through round_001/pseudo_labels
                                        # each arm up to its round-1 labels and what they read (no verdict)
    python -m noisy_student_assets.grid checks experiments/tau.yaml     # each check's outcome, per arm
    python -m noisy_student_assets.grid power experiments/tau.yaml --effect 0.05 --lake results
                                        # the seeds each verdict needs for that effect, and their hours

`run` materializes, in this process and recorded in the Dagster instance (`DAGSTER_HOME`, read from `.env`
like the dagster CLI does), each arm's assets in one run per arm (its task's problems and base model first), then
the verdict. What is already materialized and still current is skipped: an asset is redone when it was never
materialized or when what it would be made of now differs from what it was made of (`core/staleness.py`: its stage
version, its effective settings - profile defaults, run config, arm overrides - and its inputs' data versions);
what is downstream of a redone asset is redone too, and each redone asset is printed with the reason. A killed grid
therefore resumes where it stopped, and a stage killed midway resumes from its own shards and TRL
checkpoints. Ctrl-C or SIGTERM stops the grid in the step it is in: that step is not retried, and no step or
run follows (one arm at a time; under `--parallel-arms` only a kill of the process group stops it at once), and
the process leaves within `EXIT_GRACE_S` even where a library's exit handler hangs (every thread's stack printed).
A check that runs as a step of its own (`finite_weights`, `smoke_generation`, `compute_matched`) and never
judged its asset's latest materialization, because the grid was killed between the two steps, is evaluated
alone, without materializing the asset again. A failed run is reported and the grid goes on to the next arm (an
arm's inputs, its task's problems and base model included, are of its own run, so that nothing of it runs past a
failed input; under a patience, no later round of it starts). `plan` and `run` refuse a run config (`--config-json`)
that a run would refuse (an unknown op or key, a value of the wrong type) before anything runs, naming the key and
the op. The same
selection from the UI: the `arm_job` (or the assets), *Materialize*, pick the arms: a backfill, which the daemon
runs in the same order.
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import fcntl
import json
import multiprocessing
import os
import signal
import sys
import threading
from collections.abc import Iterable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import get_args

from noisy_student_assets.core import environment, layout
from noisy_student_assets.core.settings import Launcher, LauncherSettings

GRID_TAG = "noisy_student/experiment"
ARM_TAG, ROUND_TAG = "noisy_student/arm", "noisy_student/rounds"
"""A grid run's arm and the rounds it materializes ("0" for an arm's foundation: its task, base model and labeled
RL), beside its experiment's `GRID_TAG`: the UI's Runs page filters by them."""
INTERRUPTS = ("DagsterExecutionInterruptedError", "KeyboardInterrupt")
"""The errors of a step stopped by a signal: Dagster fails the step with the interrupt itself (nothing retries it)."""
EXIT_GRACE_S = 60.0
"""Seconds an interrupted grid may spend exiting (its libraries' exit handlers, the threads they join) before it
prints every thread's stack and leaves without them: Ctrl-C and SIGTERM must stop it."""


def checks_not_waiting(graph, checks: Iterable, waiting: set) -> list:
    """The `checks` that read none of the asset keys in `waiting` beside their own asset (a control's
    `compute_matched` also reads the round's student)."""
    return [
        check
        for check in checks
        if not {dep.asset_key for dep in graph.get_check_spec(check).additional_deps} & waiting
    ]


def unevaluated_checks(check_targets: dict, materializations: dict) -> list:
    """The checks whose latest evaluation did not judge their asset's latest materialization.

    `check_targets` maps each check key to the storage id of the materialization its latest evaluation judged
    (None: never evaluated); `materializations` maps each asset key to its latest materialization's storage
    id (None: never materialized, so there is nothing to check yet)."""
    return [
        check
        for check, target in check_targets.items()
        if materializations.get(check.asset_key) is not None and target != materializations[check.asset_key]
    ]


def assets_through(graph, names: Iterable[str], through: Iterable[str]) -> list[str]:
    """Of `names`, in their order, the assets named in `through` and the assets they read, directly or not."""
    upstream = set().union(*(graph.get_ancestor_asset_keys(asset_key(name), include_self=True) for name in through))
    return [name for name in names if asset_key(name) in upstream]


def asset_key(name: str):
    """The asset key of a name as the layout writes it ('round_001/pseudo_labels')."""
    import dagster as dg

    return dg.AssetKey(name.split("/"))


def run_config_errors(job, run_config: dict) -> list[str]:
    """What of `run_config` a run of `job` (or of a subset of it) would refuse once it starts, each naming the key and
    the op: an op `job` does not have, a key the op's config does not have, a value of the wrong type."""
    import dagster as dg

    ops = run_config.get("ops", {})
    errors = [f"op {name}: the code location has no such op" for name in ops if name not in job.graph.node_dict]
    try:
        dg.validate_run_config(job, run_config)
    except dg.DagsterInvalidConfigError as invalid:
        errors += [_config_error(error) for error in invalid.errors]
    return errors


def left_out_ops(job, run_config: dict, rounds: int) -> list[str]:
    """The ops `run_config` configures that `job` lacks because the code location leaves their asset out where no arm
    of its experiment files runs it (a control, a verifier, a validation eval: `progress.AskedFor`), with their checks'
    ops: ignored, not refused, so that one run config serves experiment directories that run different sets."""
    from noisy_student_assets.core import layout
    from noisy_student_assets.defs.checks import SMOKE_GENERATION

    optional = [layout.LABELED_RL_VALIDATION]
    for number in range(1, rounds + 1):
        every = layout.round_asset_names(number, layout.CONTROLS, validated=True, verified=True)
        optional += sorted(set(every) - set(layout.round_asset_names(number, ())))
    ops = {name.replace("/", "__") for name in optional}
    ops |= {f"{op}_{SMOKE_GENERATION}" for op in ops}  # a checkpoint's check, an op of its own
    return [op for op in run_config.get("ops", {}) if op in ops and op not in job.graph.node_dict]


def _config_error(error) -> str:
    """One of Dagster's config errors, naming the op: 'op problem_pool: unknown key bogus (at
    root:ops:problem_pool:config)'."""
    path = list(error.stack.levels)
    where = f"op {path[1]}" if path[:1] == ["ops"] and len(path) > 1 else "the run config"
    if error.reason.name in ("FIELD_NOT_DEFINED", "FIELDS_NOT_DEFINED"):
        unknown = getattr(error.error_data, "field_names", None) or [error.error_data.field_name]
        return f"{where}: unknown key {', '.join(unknown)} (at {':'.join(['root', *path])})"
    return f"{where}: {error.message.split(' Expected:')[0]}"


def _filtered_run_config(run_config: dict, node_names: Iterable[str]) -> dict:
    """`run_config` with only the ops of this run (Dagster rejects config of ops outside the job)."""
    names = set(node_names)
    return run_config | {"ops": {op: value for op, value in run_config.get("ops", {}).items() if op in names}}


def materialize_selection(
    names: Iterable[str],
    *,
    partition: str | None,
    instance,
    resources: dict,
    run_config: dict | None = None,
    tags: dict | None = None,
    raise_on_error: bool = True,
):
    """Materialize the assets `names` ('round_001/generations', ...; a multi-asset's siblings join) of one arm
    (or of the shared ones) in this process, with the checks of those assets. `run_config` may hold config
    of any op of the code location: only the selected ones' is passed on."""
    import dagster as dg

    from noisy_student_assets.defs.code_location import defs
    from noisy_student_assets.defs.current_defaults import CURRENT_DEFAULTS

    graph = defs.resolve_asset_graph()
    keys = dg.AssetSelection.assets(*(asset_key(n) for n in names)).required_multi_asset_neighbors().resolve(graph)
    # The checks `dg.materialize` of these assets runs: theirs, less the current-defaults sensor's own.
    checks = {check for check in graph.asset_check_keys if check.asset_key in keys and check.name != CURRENT_DEFAULTS}
    job = named_job(keys, partition).get_subset(asset_selection=keys, asset_check_selection=checks)
    rounds = sorted({layout.round_number(key.path[0]) if len(key.path) > 1 else 0 for key in keys})
    named = {ARM_TAG: partition, ROUND_TAG: ",".join(map(str, rounds))} if partition else {}
    return job.execute_in_process(
        run_config=_filtered_run_config(run_config or {}, job.graph.node_dict),
        instance=instance,
        partition_key=partition,
        resources=resources,
        tags=(tags or {}) | named,
        raise_on_error=raise_on_error,
    )


def named_job(keys: set, partition: str | None):
    """The code location's smallest job that holds every one of `keys` (a round's job, else `arm_job`; the shared
    assets': `verdict_job`): a run of a subset of it is listed under its name, where the UI's Runs, Jobs and
    Overview pages group it, not as one more run of the hidden asset job."""
    from noisy_student_assets.defs.code_location import defs

    jobs = [defs.resolve_job_def(job.name) for job in defs.jobs]
    holding = [
        job
        for job in jobs
        if keys <= job.asset_layer.selected_asset_keys and (job.partitions_def is None) == (partition is None)
    ]
    return min(holding, key=lambda job: len(job.asset_layer.selected_asset_keys), default=None) or (
        defs.resolve_implicit_global_asset_job_def()
    )


def evaluate_checks(
    checks: Iterable,
    *,
    partition: str | None,
    instance,
    resources: dict,
    run_config: dict | None = None,
    tags: dict | None = None,
):
    """Evaluate the asset checks `checks` (keys of checks that are steps of their own) of one arm, or of the
    shared assets, against their assets' latest materializations, materializing nothing: as the UI's *Execute
    checks* runs them, a subset of `arm_job` for an arm's (a run that selects no asset has no partitions of its
    own) or of the global asset job for the shared ones'."""
    from noisy_student_assets.defs.code_location import defs
    from noisy_student_assets.defs.jobs import ARM_JOB

    whole = defs.resolve_job_def(ARM_JOB) if partition else defs.resolve_implicit_global_asset_job_def()
    job = whole.get_subset(asset_selection=set(), asset_check_selection=set(checks))
    return job.execute_in_process(
        run_config=_filtered_run_config(run_config or {}, job.graph.node_dict),
        instance=instance,
        partition_key=partition,
        resources=resources,
        tags=tags,
        raise_on_error=False,
    )


class Grid:
    """Materializes one experiment's grid against the instance at DAGSTER_HOME."""

    def __init__(self, experiment_path: Path, run_config: dict | None = None, launcher: str | None = None) -> None:
        self.path, self.launcher_override = experiment_path, launcher
        import dagster as dg

        from noisy_student_assets.core.experiments.arms import load_experiments
        from noisy_student_assets.core.experiments.directory import default_experiments_dir
        from noisy_student_assets.defs.code_location import ASSET_DEFINITIONS, defs
        from noisy_student_assets.defs.partitions import ARMS, ROUNDS

        directory = default_experiments_dir().resolve()
        # A file of the directory, or the file one of its links points at (`make view`'s directory links its file).
        if (directory / experiment_path.name).resolve() != experiment_path.resolve():
            raise SystemExit(
                f"{experiment_path}: experiment files live in {directory} (NOISY_STUDENT_EXPERIMENTS), which the code "
                "location reads"
            )
        self.experiment = load_experiments(directory)[experiment_path.stem]
        if self.experiment.max_rounds > ROUNDS:
            raise SystemExit(
                f"{self.experiment.name} asks for {self.experiment.max_rounds} rounds; the code location defines "
                f"{ROUNDS}"
            )
        self.dg, self.arms_def = dg, ARMS
        self.graph = defs.resolve_asset_graph()
        self.check_steps = {key for checks in ASSET_DEFINITIONS.asset_checks for key in checks.check_keys}
        run_config = run_config or {}
        whole = defs.resolve_implicit_global_asset_job_def()
        ignored = left_out_ops(whole, run_config, ROUNDS)
        if ignored:
            print(
                "[grid] run config of ops the code location leaves out (no arm of its experiment files runs their "
                f"asset), ignored: {', '.join(ignored)}",
                flush=True,
            )
        kept = [op for op in run_config.get("ops", {}) if op not in ignored]
        self.run_config = _filtered_run_config(run_config, kept)
        errors = run_config_errors(whole, self.run_config)
        if errors:
            raise SystemExit("the run config (--config-json) is refused before any run: " + "; ".join(errors))
        self.instance = dg.DagsterInstance.get()
        self.resources = with_experiment_resources(self.experiment, launcher)

    def register(self) -> list[str]:
        """Add the experiment's arms to the `arm` partitions; returns the ones that were new."""
        known = set(self.instance.get_dynamic_partitions(self.arms_def.name))
        new = [arm for arm in self.experiment.arms if arm not in known]
        if new:
            self.instance.add_dynamic_partitions(self.arms_def.name, new)
        return new

    @property
    def launcher_kind(self) -> str:
        return self.resources["stage_resources"].launcher.kind

    def run(
        self,
        rounds: int | None = None,
        parallel_arms: int = 1,
        only: list[str] | None = None,
        through: list[str] | None = None,
    ) -> bool:
        """Materialize whatever of the grid is missing or stale, up to round `rounds` (default: all the
        experiment's), `parallel_arms` arms at a time, of the arms named in `only` (default: every arm); with
        `through` (assets, e.g. [round_001/pseudo_labels]), of each arm only those assets and what they read, and no
        verdict. False if any run failed."""
        arms = self._selected(only, through)
        self.register()
        self._fail_orphaned_runs()
        # Ray places the heavy steps on its GPUs and queues the rest: the pool must not hold them to one at a time.
        compute = self.resources["stage_resources"].compute
        self._set_device_pool_limit(parallel_arms if self.launcher_kind == "ray" else compute.device_slots)
        try:
            ok = True
            if parallel_arms == 1:
                for arm in arms:
                    ok = self.materialize_arm(arm, rounds, through) and ok
                    self.record_hours([arm])  # an arm's hours as soon as it ends: a grid stopped later keeps them
            else:
                jobs = [(self.path, self.run_config, self.launcher_override, rounds, arm.name, through) for arm in arms]
                with ProcessPoolExecutor(
                    max_workers=parallel_arms, mp_context=multiprocessing.get_context("spawn")
                ) as pool:
                    ok = all(list(pool.map(_materialize_arm, jobs))) and ok  # all arms, not up to the first failed one
                self.record_hours(arms)
            if through:  # the verdict reads every arm's students, which a partial run leaves out
                return ok
            return self._materialize([layout.VERDICT], None, always=True) and ok
        finally:
            self._set_device_pool_limit(1)

    def materialize_arm(self, arm, rounds: int | None = None, through: list[str] | None = None) -> bool:
        """Materialize what is missing or stale of one arm up to round `rounds` (default: its `max_rounds`), in one
        run; with a patience, one run per round, each round only if the arm's stopping rule lets it run (the rule the
        next-round automation applies). With `through`, only those assets and what they read. False if a run failed."""
        from noisy_student_assets.core.experiments.progress import arm_assets, last_round
        from noisy_student_assets.defs.automation import stopped

        last = last_round(arm, rounds)
        if through:
            return self._materialize(assets_through(self.graph, arm_assets(self.experiment, arm, last), through), arm)
        if arm.stopping_rule.patience is None:
            return self._materialize(arm_assets(self.experiment, arm, last), arm)
        for number in range(last + 1):
            if number and (reason := stopped(self.instance, arm, number - 1)):
                print(f"[grid] arm {arm.name}: stopped after round {number - 1}: {reason}", flush=True)
                return True
            if not self._materialize(arm_assets(self.experiment, arm, number), arm):
                return False
        return True

    def _known_targets(self, arm, rounds: int | None) -> list[str]:
        """The assets of `arm` up to round `rounds`, less the rounds its stopping rule rules out from what the
        instance recorded so far."""
        from noisy_student_assets.core.experiments.progress import arm_assets, last_round
        from noisy_student_assets.defs.automation import stopped

        last = last_round(arm, rounds)
        return arm_assets(
            self.experiment, arm, next((done for done in range(last) if stopped(self.instance, arm, done)), last)
        )

    def check_outcomes(self) -> list[dict]:
        """Each check of every arm's assets on the asset's latest materialization: passed, failed, or not judged (never
        evaluated on it)."""
        from noisy_student_assets.defs.current_defaults import CURRENT_DEFAULTS
        from noisy_student_assets.defs.records import check_outcomes_on

        rows, run_evaluations = [], {}
        scopes = [(arm.name, self._known_targets(arm, None)) for arm in self.experiment.all_arms()]
        for partition, names in scopes:
            for name in names:
                # the current-defaults check judges the defaults, not the run config the grid runs with (`plan`)
                checks = [
                    check for check in self.graph.get(asset_key(name)).check_keys if check.name != CURRENT_DEFAULTS
                ]
                materialization = self._latest(name, partition)
                passed = (
                    check_outcomes_on(self.instance, materialization, checks, partition, run_evaluations)
                    if materialization
                    else {}
                )
                judged = {check: "passed" if outcome else "failed" for check, outcome in passed.items()}
                rows += [
                    {
                        "arm": partition,
                        "asset": name,
                        "check": check.name,
                        "outcome": judged.get(check, "not judged"),
                    }
                    for check in checks
                ]
        return rows

    def _set_device_pool_limit(self, limit: int) -> None:
        from resources.compute import DEVICE_POOL

        self.instance.event_log_storage.set_concurrency_slots(DEVICE_POOL, limit)

    def _latest(self, name: str, partition: str | None):
        from noisy_student_assets.defs.records import latest_materialization

        return latest_materialization(self.instance, asset_key(name), partition)

    def _selected(self, only: list[str] | None, through: list[str] | None) -> list:
        """The arms named in `only` (default: every arm), once `only` names arms of the experiment and `through`
        assets of the code location."""
        unknown = sorted(set(only or ()) - set(self.experiment.arms))
        if unknown:
            raise SystemExit(
                f"{self.experiment.name} has no arm {', '.join(unknown)}; its arms: {', '.join(self.experiment.arms)}"
            )
        for name in through or ():
            if not self.graph.has(asset_key(name)):
                raise SystemExit(f"--through {name}: the code location has no such asset")
        return [arm for arm in self.experiment.all_arms() if not only or arm.name in only]

    def plan(
        self, rounds: int | None = None, only: list[str] | None = None, through: list[str] | None = None
    ) -> dict[str, dict[str, str]]:
        """What `run` would materialize with the same arguments, without materializing anything: per arm, each asset
        to redo and why."""
        arms = self._selected(only, through)
        self.register()
        plans = {}
        for arm in arms:
            targets = self._known_targets(arm, rounds)
            plans[arm.name] = self._stale(assets_through(self.graph, targets, through) if through else targets, arm)[1]
        return plans

    def _stale(self, targets: list[str], arm) -> tuple[dict, dict[str, str]]:
        """The latest materialization of each target and of its inputs, and the targets to redo with the reason
        (`staleness.stale_assets`)."""
        from noisy_student_assets.core import staleness
        from noisy_student_assets.defs import lineage

        partition = arm.name if arm else None
        latest, parents, made = {}, {}, {}
        for name in targets:
            parents[name] = [parent.to_user_string() for parent in self.graph.get(asset_key(name)).parent_keys]
            for asset in [name, *parents[name]]:
                if asset not in latest:
                    node = self.graph.get(asset_key(asset))
                    latest[asset] = self._latest(asset, partition if node.partitions_def else None)
                    made[asset] = self._made_with(node.assets_def, arm)
        versions = {
            name: (record.storage_id, lineage.data_version_of(record)) for name, record in latest.items() if record
        }
        recorded = {
            name: lineage.recorded(
                record,
                made[name][0],
                made[name][2],
                {parent: versions.get(parent, (None, staleness.MISSING)) for parent in parents.get(name, [])},
            )
            for name, record in latest.items()
        }
        stages, settings = {name: made[name][0] for name in targets}, {name: made[name][1] for name in targets}
        return latest, staleness.stale_assets(targets, parents, stages, settings, recorded)

    def _materialize(self, targets: list[str], arm, always: bool = False) -> bool:
        partition = arm.name if arm else None
        latest, reasons = self._stale(targets, arm)
        reasons = {name: "always" for name in targets} if always else reasons
        selected = [name for name in targets if name in reasons]
        where = f"arm {partition}" if partition else "verdict"
        kept = [name for name in targets if name not in selected]
        # A check that also reads a selected asset (a control's compute_matched reads the student) waits for it.
        checked = self._evaluate_unevaluated_checks(kept, latest, partition, where, waiting_on=selected)
        if not selected:
            print(f"[grid] {where}: up to date", flush=True)
            return checked
        print(f"[grid] {where}: materializing {', '.join(selected)}", flush=True)
        if not always:
            _print_reasons(where, reasons)
        result = materialize_selection(selected, partition=partition, raise_on_error=False, **self._run_settings())
        if not _succeeded(result, where):
            return False
        return self._evaluate_unevaluated_checks(kept, latest, partition, where) and checked

    def _made_with(self, assets_def, arm) -> tuple[str, dict, dict | None]:
        """An asset's stage version, what of its settings its fingerprint covers (this grid's run config, the arm's
        overrides and a heavy stage's compute settings), and those compute settings (None: not heavy)."""
        from noisy_student_assets.core.profiles import active_profile
        from noisy_student_assets.defs import lineage

        config_class = lineage.config_class(assets_def)
        op_config = self.run_config.get("ops", {}).get(assets_def.op.name, {}).get("config", {})
        config = lineage.run_config_of(assets_def, op_config) if config_class is not None else None
        compute = (
            self.resources["stage_resources"].compute.settings.model_dump() if lineage.is_heavy(assets_def.op) else None
        )
        settings = lineage.made_with(lineage.run_settings(config, arm), compute, active_profile())
        return lineage.stage_version(config_class), settings, compute

    def _evaluate_unevaluated_checks(
        self, names: list[str], latest: dict, partition: str | None, where: str, waiting_on: list[str] = ()
    ) -> bool:
        """Run the checks of the assets `names` (not redone in this run) that never judged their latest
        materialization, except those that also read an asset in `waiting_on`; False if that run failed."""
        from noisy_student_assets.defs.records import latest_check_targets

        own_steps = [
            check for name in names for check in self.graph.get(asset_key(name)).check_keys if check in self.check_steps
        ]
        checks = checks_not_waiting(self.graph, own_steps, {asset_key(name) for name in waiting_on})
        materializations = {asset_key(name): latest[name].storage_id if latest[name] else None for name in names}
        pending = unevaluated_checks(latest_check_targets(self.instance, checks, partition), materializations)
        if not pending:
            return True
        listed = ", ".join(f"{check.asset_key.to_user_string()}:{check.name}" for check in pending)
        print(
            f"[grid] {where}: evaluating checks that never judged their asset's latest materialization: {listed}",
            flush=True,
        )
        return _succeeded(evaluate_checks(pending, partition=partition, **self._run_settings()), where)

    def _run_settings(self) -> dict:
        """What every run of this grid is given: the instance, resources, run config and the experiment's tag."""
        return {
            "instance": self.instance,
            "resources": self.resources,
            "run_config": self.run_config,
            "tags": {GRID_TAG: self.experiment.name},
        }

    def record_hours(self, arms: list) -> None:
        """Record in the lake, per arm of `arms`, the hours this experiment's finished grid runs of it took in the
        Dagster instance (`lake_reader.ArmHours`): what `power` reads as the cost of a seed. A lake shared by another
        instance gets that instance's count."""
        from noisy_student_assets.core.lake_reader import ArmHours, ArmLake

        finished = self.instance.get_run_records(
            self.dg.RunsFilter(
                tags={GRID_TAG: self.experiment.name},
                statuses=[self.dg.DagsterRunStatus.SUCCESS, self.dg.DagsterRunStatus.FAILURE],
            )
        )
        names = {arm.name for arm in arms}
        seconds: dict[str, list[float]] = {}
        for record in finished:
            arm = record.dagster_run.tags.get("dagster/partition")
            if arm in names and record.start_time and record.end_time:
                seconds.setdefault(arm, []).append(record.end_time - record.start_time)
        for arm, spans in seconds.items():
            spent = ArmHours(experiment=self.experiment.name, hours=sum(spans) / 3600, runs=len(spans))
            ArmLake(layout.default_lake_root(), arm).record_grid_hours(spent)

    def _fail_orphaned_runs(self) -> None:
        """Runs of this experiment's grid still marked started belong to a grid process that was killed:
        the lock held for the whole `run` proves none is alive. They are marked failed, so the UI says so, and
        the `device` pool slots their steps held are freed, or the resumed run would wait for them forever.

        Dagster's run monitoring (dagster.yaml) does neither for these runs: it is the daemon's, and no daemon runs
        beside the grid, which runs its runs in its own process (`dg.materialize`). Even under a daemon, the default
        run launcher cannot tell a dead worker (no `check_run_worker_health`), so a started run whose process died
        is failed only past its max runtime, and the daemon frees the slots of finished runs alone."""
        lock_path = layout.default_lake_root() / f".grid-{self.experiment.name}.lock"
        lock_path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = lock_path.open("a")
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as held:
            raise SystemExit(f"another grid of {self.experiment.name} is running (lock {lock_path})") from held
        started = self.instance.get_run_records(
            self.dg.RunsFilter(tags={GRID_TAG: self.experiment.name}, statuses=[self.dg.DagsterRunStatus.STARTED])
        )
        for record in started:
            self.instance.report_run_failed(
                record.dagster_run, "the grid process running it was killed; the grid resumes it"
            )
            self.instance.event_log_storage.free_concurrency_slots_for_run(record.dagster_run.run_id)


def _materialize_arm(job: tuple) -> bool:
    """One arm's part of a grid run, in a process of its own (`--parallel-arms`)."""
    path, run_config, launcher, rounds, arm_name, through = job
    grid = Grid(path, run_config, launcher)
    return grid.materialize_arm(grid.experiment.arm(arm_name), rounds, through)


def with_experiment_resources(experiment, kind: str | None = None) -> dict:
    """The code location's resources with the experiment's launcher and compute (each None: the resource's), the
    launcher's kind replaced by `kind` (the command line's)."""
    from noisy_student_assets.defs.code_location import defs
    from resources.compute import ComputeResource
    from resources.launchers import StageLauncher
    from resources.stage_resources import StageResources

    resources = defs.resources
    if experiment.launcher is None and experiment.compute is None and kind is None:
        return resources
    stage = resources["stage_resources"]
    launcher = (experiment.launcher or LauncherSettings(**stage.launcher.model_dump())).model_dump() | (
        {"kind": kind} if kind else {}
    )
    compute = (
        ComputeResource(**experiment.compute.model_dump(), lock_dir=stage.compute.lock_dir)
        if experiment.compute
        else stage.compute
    )
    return resources | {
        "compute": compute,
        "stage_resources": StageResources(
            lake=stage.lake,
            compute=compute,
            launcher=StageLauncher(**launcher),
            tracking=stage.tracking,
            experiments=stage.experiments,
        ),
    }


def _print_check_outcomes(rows: list[dict]) -> None:
    """Each check's outcome on its asset's latest materialization, per arm, then a count by check and outcome."""
    import polars as pl

    from noisy_student_assets.core.reporting.markdown import markdown_table

    table = pl.DataFrame(rows, schema={"arm": pl.Utf8, "asset": pl.Utf8, "check": pl.Utf8, "outcome": pl.Utf8})
    counts = table.group_by("check", "outcome").len("checks").sort("check", "outcome")
    print(markdown_table(table) + "\n\n" + markdown_table(counts))


def _print_power(grid: Grid, lake: Path, effects: list[float], hours_per_seed: float | None) -> None:
    """The seeds each comparison of the experiment needs for `effects` (`core.reporting.power`), and their cost: the
    hours given, else the mean over the experiment's seeds of the hours the grid recorded for each seed's arms in
    `lake` (`seed_hours`)."""
    import polars as pl

    from noisy_student_assets.core.reporting.markdown import markdown_table
    from noisy_student_assets.core.reporting.power import MOST_SEEDS, power_table, seed_hours, seeds_column
    from noisy_student_assets.core.reporting.verdict import PILOT_SEEDS

    arms = grid.experiment.all_arms()
    recorded = list(seed_hours(lake, arms).values())
    hours = hours_per_seed if hours_per_seed is not None else (sum(recorded) / len(recorded) if recorded else None)
    table = power_table(lake, arms, effects, hours)
    if not table.height:
        print(f"{grid.experiment.name}: no round evaluated in {lake}; a pilot needs {PILOT_SEEDS} seeds per group")
        return
    print(markdown_table(table))
    if hours_per_seed is not None:
        cost = f"{hours:.2f} h per seed (given)"
    elif recorded:
        cost = (
            f"{hours:.2f} h per seed (the mean over {len(recorded)} seeds of the grid's runs of each seed's arms, "
            f"recorded in {lake}: a seed's labeled RL, samples and controls count once)"
        )
    else:
        cost = f"no cost per seed recorded in {lake} (the grid records it; --hours-per-seed gives one)"
    print(f"\nSeeds for 80% power at the verdicts' own two-sided 95% intervals; {cost}.")
    piloted = table.filter(pl.col("pilot") == "done")
    out_of_reach = [f"{effect:g}" for effect in effects if piloted[seeds_column(effect)].null_count()]
    if out_of_reach:
        print(
            f"n/a for {', '.join(out_of_reach)} after a pilot: not even {MOST_SEEDS} seeds would detect it at the "
            "spread measured."
        )


def _print_reasons(where: str, reasons: dict[str, str]) -> None:
    for name, reason in reasons.items():
        print(f"[grid] {where}: {name}: {reason}", flush=True)


def _succeeded(result, where: str) -> bool:
    """Whether the run succeeded; a failed run is reported and the grid goes on to the next arm, unless the run
    was interrupted (Ctrl-C, SIGTERM), which stops the grid: Dagster turned the signal into the run's failure."""
    if not result.success:
        if any(event.step_failure_data.error.cls_name in INTERRUPTS for event in result.get_step_failure_events()):
            raise KeyboardInterrupt(f"run {result.run_id} ({where})")
        print(
            f"[grid] {where}: run {result.run_id} failed; see it in the UI (dagster dev) or re-run the grid to resume",
            flush=True,
        )
    return result.success


def _load_dotenv() -> None:
    """Read `.env` (written by `make setup`) as the dagster CLI does, without overriding the environment."""
    from dotenv import load_dotenv

    load_dotenv(Path.cwd() / ".env", override=False)


def _parser() -> argparse.ArgumentParser:
    """The grid's command line."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["register", "plan", "run", "checks", "power"])
    parser.add_argument("experiment", type=Path, help="an experiment file, experiments/<name>.yaml")
    parser.add_argument("--config-json", default="{}", help="run config for every run (the dagster CLI's format)")
    parser.add_argument(
        "--launcher",
        choices=get_args(Launcher),
        help="where the heavy stages run (default: the experiment file's, else the resource's)",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=None,
        help="run: stop after this round in every arm (default: each arm's max_rounds); e.g. round 1 of every arm"
        " first, then a run without it adds the rest",
    )
    parser.add_argument(
        "--parallel-arms",
        type=int,
        default=1,
        help="run: arms materialized at once (their heavy steps overlap on Ray, or up to compute.device_slots at once)",
    )
    parser.add_argument(
        "--arm",
        action="append",
        default=[],
        help="run and plan: this arm only (repeatable; default: every arm of the experiment)",
    )
    parser.add_argument(
        "--through",
        action="append",
        default=[],
        help="run and plan: each arm only up to this asset and what it reads, and no verdict (repeatable: the union;"
        " e.g. round_001/pseudo_labels: the labels' direct effect without the students)",
    )
    parser.add_argument(
        "--ray-gpus",
        type=int,
        default=None,
        help="ray launcher without RAY_ADDRESS: GPUs the grid's own local cluster declares (default: those torch sees);"
        " more than the machine has only tries Ray's placement",
    )
    parser.add_argument(
        "--effect",
        type=float,
        action="append",
        default=[],
        help="power: a true effect (greedy accuracy) to detect with 80%% power (repeatable; default 0.05 and 0.10)",
    )
    parser.add_argument(
        "--lake", type=Path, default=None, help="power: read this lake or results directory (default: the data lake)"
    )
    parser.add_argument(
        "--hours-per-seed",
        type=float,
        default=None,
        help="power: the hours one seed costs (default: the mean of those the grid recorded for the experiment's "
        "arms in --lake)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.rounds is not None and args.rounds < 0:
        parser.error(f"--rounds must be >= 0, got {args.rounds}")
    if args.parallel_arms < 1:
        parser.error(f"--parallel-arms must be >= 1, got {args.parallel_arms}")
    _load_dotenv()
    grid = Grid(args.experiment, json.loads(args.config_json), args.launcher)
    if args.command == "register":
        new = grid.register()
        print(f"{grid.experiment.name}: arms {', '.join(grid.experiment.arms)} ({len(new)} new)")
        return 0
    if args.command == "checks":
        _print_check_outcomes(grid.check_outcomes())
        return 0
    if args.command == "power":
        _print_power(grid, args.lake or layout.default_lake_root(), args.effect or [0.05, 0.10], args.hours_per_seed)
        return 0
    if args.command == "plan":
        for partition, reasons in grid.plan(args.rounds, args.arm, args.through).items():
            where = f"arm {partition}"
            if reasons:
                _print_reasons(where, reasons)
            else:
                print(f"[grid] {where}: up to date")
        return 0
    # SIGTERM stops the grid as Ctrl-C does. After each run Dagster gives SIGTERM SIGINT's handler, so SIGINT
    # must not stay ignored as a shell's background job inherits it.
    for stop in (signal.SIGINT, signal.SIGTERM):
        signal.signal(stop, signal.default_int_handler)
    try:
        with _ray_cluster_if_needed(grid, args.ray_gpus):
            return 0 if grid.run(args.rounds, args.parallel_arms, args.arm, args.through) else 1
    except KeyboardInterrupt as interrupt:
        during = f" during {interrupt}" if str(interrupt) else ""
        print(f"[grid] stopped by an interrupt{during}; re-run the grid to resume", flush=True)
        exit_within(EXIT_GRACE_S, 130)
        return 130


def exit_within(seconds: float, status: int) -> None:
    """Leave the process with `status` if it still runs `seconds` from now, every thread's stack printed first (on
    stderr), so that what held it is named."""

    def leave() -> None:
        print(f"[grid] still exiting after {seconds:.0f} s; every thread's stack:", file=sys.stderr, flush=True)
        faulthandler.dump_traceback(all_threads=True)
        os._exit(status)

    timer = threading.Timer(seconds, leave)
    timer.daemon = True
    timer.start()


@contextlib.contextmanager
def _ray_cluster_if_needed(grid: Grid, gpus: int | None):
    """Under the ray launcher with no cluster named (RAY_ADDRESS, launcher.ray_address), a local cluster of this
    machine's CPUs for the grid's duration, stopped after it."""
    launcher = grid.resources["stage_resources"].launcher
    if grid.launcher_kind != "ray" or launcher.ray_address or environment.ray_address():
        yield
        return
    import torch

    from resources.ray_cluster import local_ray_cluster

    gpus = torch.cuda.device_count() if gpus is None else gpus
    with local_ray_cluster(num_cpus=os.cpu_count() or 1, num_gpus=gpus) as head:
        address = head.address
        print(
            f"[grid] started a local Ray cluster at {address} ({os.cpu_count()} CPUs, {gpus} GPUs); it stops with "
            "the grid",
            flush=True,
        )
        os.environ[environment.RAY_ADDRESS] = address  # for the launcher, as a user would set it
        try:
            yield
        finally:
            del os.environ[environment.RAY_ADDRESS]
