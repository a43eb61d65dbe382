"""One Noisy Student round per arm, as one asset per artifact (made by `round_definitions(n)`; every asset named
below is under `round_00n/`):

    teacher ──► generations ──► pseudo_labels ──► student_checkpoint ──► eval_report
    (labeled RL, or round                          ▲ teacher,         │    ▲ pseudo-labels, labeled-only
    n-1's student)                                 generations,       │      eval, earlier evals
                                                   labeled problems,  │
                                                   base model         └─► student_validation

Every read is a declared input, so the UI draws what fed what, and re-materializing `round_002/pseudo_labels*`
with a new tau re-runs only the vote, the student and what is downstream: the generations are not an input of
the vote's settings. A round's heavy stages run through the one heavy step (`stages.run_heavy`), each supplying
its part here (`Sampling`, `VerifierTraining`, `Scoring`), so they are also reused across arms: a run with the same
content key (for the samples: teacher weights, problems, settings, prompt format; for the verifier: teacher
weights, labeled and validation problems, settings; for its scores: the verifier and the samples) is read back, not
repeated. `student_validation` (the student on the
arm's validation problems) is what an arm's patience reads; only arms with one materialize it.
"""

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import dagster as dg
import polars as pl

from noisy_student_assets.core import layout
from noisy_student_assets.core.checkpoints import weights_sha256
from noisy_student_assets.core.experiments.progress import AskedFor
from noisy_student_assets.core.lake_reader import RoundLabels
from noisy_student_assets.core.problems import fingerprint as problems_fingerprint
from noisy_student_assets.core.promotion import first_made, read_promotion
from noisy_student_assets.core.prompts import prompt_template
from noisy_student_assets.core.pseudo_labels.labels import PublishedAudit
from noisy_student_assets.core.pseudo_labels.student_data import labeled_rows
from noisy_student_assets.core.reporting.eval_report import PublishedEval
from noisy_student_assets.core.reporting.inspection import explorer_link
from noisy_student_assets.core.reporting.round_report import RoundEvidence, round_report
from noisy_student_assets.core.training.modes.base import StudentData
from noisy_student_assets.defs.assets.metadata import markdown_table
from noisy_student_assets.defs.assets.models import checkpoint_eval
from noisy_student_assets.defs.assets.stages import (
    HEAVY,
    PROBLEMS_FILE,
    HeavyStage,
    StageRun,
    capped_to_teacher,
    evaluate,
    run_heavy,
    stage,
    train_checkpoint,
)
from noisy_student_assets.defs.checks import (
    EVAL_NOT_DEGENERATE,
    NO_EVAL_REGRESSION,
    PSEUDO_LABEL_QUALITY,
    VERIFIER_INFORMATIVE,
    checkpoint_checks,
    no_eval_regression,
    pseudo_label_quality,
    reported_check,
    verifier_informative,
)
from noisy_student_assets.defs.config import (
    EvalConfig,
    PseudoLabelConfig,
    SamplingConfig,
    StudentConfig,
    VerifierConfig,
)
from noisy_student_assets.defs.lineage import reuse_key
from noisy_student_assets.defs.partitions import ARMS, ASKED_FOR, round_group, round_key, teacher_key
from noisy_student_assets.payloads.specs import SampleSpec, ScoreSpec, VerifierSpec
from resources.data_lake import CONTENT_KEY_FILE, LakeTable
from resources.launchers.base import StageResult
from resources.stage_resources import StageResources


def checkpoint_input(key: dg.AssetKey | str) -> dg.AssetIn:
    return dg.AssetIn(key, input_manager_key="checkpoint_io_manager")


BASE_MODEL_INPUT = checkpoint_input(layout.BASE_MODEL)
"""The init of a round's student and of its gold- and random-label controls when `student_init` is base_model."""


def eval_input(key: dg.AssetKey | str) -> dg.AssetIn:
    return dg.AssetIn(key, input_manager_key="eval_io_manager")


def round_definitions(number: int, asked_for: AskedFor = ASKED_FOR) -> dg.Definitions:
    """Round `number`'s assets and checks, one factory per asset (`ROUND_ASSETS`): generations, pseudo-labels,
    student checkpoint, eval report; the verifier and its scores, and the student's validation eval, where
    `asked_for` says an arm runs them."""
    return dg.Definitions(
        assets=[make(number, asked_for) for make, wanted in ROUND_ASSETS if wanted(asked_for)],
        asset_checks=checkpoint_checks(round_key(number, layout.STUDENT)),
    )


def _heavy(number: int) -> dict:
    """What a round's heavy asset is declared with: its round's group, the arms, the device pool."""
    return {"group_name": round_group(number), "partitions_def": ARMS, **HEAVY}


def _generations_asset(number: int, _: AskedFor) -> dg.AssetsDefinition:
    """The teacher's K samples of each unlabeled problem."""
    generations_key, teacher = round_key(number, layout.GENERATIONS), checkpoint_input(teacher_key(number))

    @dg.asset(
        key=generations_key,
        ins={"teacher": teacher, "unlabeled_problems": dg.AssetIn(layout.UNLABELED_PROBLEMS)},
        description="K samples per unlabeled problem from the round's teacher (parquet).",
        **_heavy(number),
    )
    def generations(
        context: dg.AssetExecutionContext,
        config: SamplingConfig,
        teacher: Path,
        unlabeled_problems: pl.DataFrame,
        stage_resources: StageResources,
    ) -> dg.Output[LakeTable]:
        with stage(context, config, stage_resources, params={"teacher": str(teacher)}) as current:
            table = _sample(current, teacher, unlabeled_problems)
        return current.output(table)

    return generations


def _verifier_asset(number: int, _: AskedFor) -> dg.AssetsDefinition:
    """The outcome verifier trained on the teacher's samples of the labeled problems."""
    verifier_key, teacher = round_key(number, layout.VERIFIER), checkpoint_input(teacher_key(number))

    @dg.asset(
        key=verifier_key,
        io_manager_key="checkpoint_io_manager",
        ins={
            "teacher": teacher,
            "labeled_problems": dg.AssetIn(layout.LABELED_PROBLEMS),
            "validation_problems": dg.AssetIn(layout.VALIDATION_PROBLEMS),
        },
        check_specs=[reported_check(VERIFIER_INFORMATIVE, verifier_key)],
        description="An outcome verifier (reward model: the teacher's backbone with a scalar head and LoRA, TRL's "
        "RewardTrainer) trained on the teacher's right and wrong samples of the labeled problems, measured on its "
        "samples of the validation problems (AUROC, label accuracy). Only arms whose label source reads it "
        "materialize it.",
        **_heavy(number),
    )
    def verifier(
        context: dg.AssetExecutionContext,
        config: VerifierConfig,
        teacher: Path,
        labeled_problems: pl.DataFrame,
        validation_problems: pl.DataFrame,
        stage_resources: StageResources,
    ):
        with stage(context, config, stage_resources, params={"teacher": str(teacher)}) as current:
            staged, check = _train_verifier(current, teacher, labeled_problems, validation_problems)
        yield current.output(staged)
        yield check

    return verifier


def _verifier_scores_asset(number: int, _: AskedFor) -> dg.AssetsDefinition:
    """The verifier's score of each of the round's samples."""
    scores_key = round_key(number, layout.VERIFIER_SCORES)

    @dg.asset(
        key=scores_key,
        ins={
            "verifier": checkpoint_input(round_key(number, layout.VERIFIER)),
            "generations": dg.AssetIn(round_key(number, layout.GENERATIONS)),
            "unlabeled_problems": dg.AssetIn(layout.UNLABELED_PROBLEMS),
        },
        description="The verifier's score (a logit) of each of the round's samples: what a verifier-weighted vote "
        "reads.",
        **_heavy(number),
    )
    def verifier_scores(
        context: dg.AssetExecutionContext,
        verifier: Path,
        generations: pl.DataFrame,
        unlabeled_problems: pl.DataFrame,
        stage_resources: StageResources,
    ) -> dg.Output[LakeTable]:
        with stage(context, None, stage_resources) as current:
            table = _score_samples(current, verifier, generations, unlabeled_problems)
        return current.output(table)

    return verifier_scores


def _pseudo_labels_asset(number: int, asked_for: AskedFor) -> dg.AssetsDefinition:
    """The vote over the round's generations, audited."""
    labels_key, scores_key = round_key(number, layout.PSEUDO_LABELS), round_key(number, layout.VERIFIER_SCORES)
    generations_key = round_key(number, layout.GENERATIONS)

    @dg.asset(
        key=labels_key,
        group_name=round_group(number),
        partitions_def=ARMS,
        ins={"generations": dg.AssetIn(generations_key), "unlabeled_problems": dg.AssetIn(layout.UNLABELED_PROBLEMS)},
        # A dependency, not an input: only an arm whose label source reads a verifier has its scores.
        deps=[scores_key] if asked_for.verifier else [],
        check_specs=[reported_check(PSEUDO_LABEL_QUALITY, labels_key)],
        description="The vote over the round's generations, each sample weighed by the arm's label source (majority: "
        "a head count), with agreement; `kept` where >= tau. Audited against the hidden gold, with every source's "
        "label-quality frontier. The verifier's scores are read where the arm materialized them.",
    )
    def pseudo_labels(
        context: dg.AssetExecutionContext,
        config: PseudoLabelConfig,
        generations: pl.DataFrame,
        unlabeled_problems: pl.DataFrame,
        stage_resources: StageResources,
    ):
        lake, arm = stage_resources.lake, context.partition_key
        scores = (
            lake.read_lake_table(scores_key, arm) if asked_for.verifier and lake.has_table(scores_key, arm) else None
        )
        with stage(context, config, stage_resources) as current:
            table, check = _pseudo_label(current, generations, unlabeled_problems, scores)
        yield current.output(table, metadata=_explorer(context.partition_key, number))
        yield check

    return pseudo_labels


def _student_asset(number: int, _: AskedFor) -> dg.AssetsDefinition:
    """The round's student, trained on the labels and kept pseudo-labels."""
    key = partial(round_key, number)
    student_key, labels_key, generations_key = key(layout.STUDENT), key(layout.PSEUDO_LABELS), key(layout.GENERATIONS)
    teacher = checkpoint_input(teacher_key(number))

    @dg.asset(
        key=student_key,
        io_manager_key="checkpoint_io_manager",
        ins={
            "teacher": teacher,
            "pseudo_labels": dg.AssetIn(labels_key),
            # sft rows, dpo pairs, vote-share rewards and the completion cap come from them
            "generations": dg.AssetIn(generations_key),
            "labeled_problems": dg.AssetIn(layout.LABELED_PROBLEMS),
            "base_model": BASE_MODEL_INPUT,
        },
        description="The round's student, next round's teacher: from the teacher (or the base model), GRPO on labeled "
        "+ kept pseudo-labeled problems, or SFT / DPO on the teacher's samples that agree with the kept labels.",
        **_heavy(number),
    )
    def student_checkpoint(
        context: dg.AssetExecutionContext,
        config: StudentConfig,
        teacher: Path,
        pseudo_labels: LakeTable,
        generations: pl.DataFrame,
        labeled_problems: pl.DataFrame,
        base_model: Path,
        stage_resources: StageResources,
    ) -> dg.Output[Path]:
        with stage(context, config, stage_resources) as current:
            kept = kept_pseudo_labels(current, pseudo_labels, labels_key)
            labeled = labeled_rows(labeled_problems, current.settings.pseudo_only)
            capped_to_teacher(current, generations)
            staged = train_from_student_init(current, teacher, base_model, StudentData(labeled, kept, generations))
        return current.output(staged, metadata={"teacher": dg.MetadataValue.path(str(teacher))})

    return student_checkpoint


def _eval_report_inputs(number: int) -> dict[str, dg.AssetIn]:
    """What a round's eval report reads: the student, the held-out problems, the labels, the labeled-only control's
    evaluation and the earlier ones (labeled RL, the base model, every earlier round: a teacher kept by its promotion
    is an earlier round's student, or labeled RL, and its flips are from that one), and from round 2 the teacher."""
    key = partial(round_key, number)
    earlier = {"previous_round": eval_input(round_key(number - 1, layout.EVAL_REPORT))} if number > 1 else {}
    earlier |= {layout.round_prefix(k): eval_input(round_key(k, layout.EVAL_REPORT)) for k in range(1, number - 1)}
    return {
        "student": checkpoint_input(key(layout.STUDENT)),
        "eval_problems": dg.AssetIn(layout.EVAL_PROBLEMS),
        "pseudo_labels": dg.AssetIn(key(layout.PSEUDO_LABELS)),
        "labeled_only_eval": eval_input(key(layout.control_eval(layout.LABELED_ONLY))),
        "labeled_rl": eval_input(layout.LABELED_RL_EVAL),
        "base_model": eval_input(layout.BASE_MODEL_EVAL),
        **earlier,
        **({"teacher": checkpoint_input(teacher_key(number))} if number > 1 else {}),
    }


def _eval_report_asset(number: int, _: AskedFor) -> dg.AssetsDefinition:
    """The round's student on the held-out problems, with the round's verdict."""
    report_key = round_key(number, layout.EVAL_REPORT)
    labeled_only_eval_key = round_key(number, layout.control_eval(layout.LABELED_ONLY))

    @dg.asset(
        key=report_key,
        io_manager_key="eval_io_manager",
        ins=_eval_report_inputs(number),
        check_specs=[reported_check(NO_EVAL_REGRESSION, report_key), reported_check(EVAL_NOT_DEGENERATE, report_key)],
        description="The round's student on eval_problems, and the verdict: its accuracy minus the labeled-only "
        "control's (same compute), with a paired interval over seeds and problems; deltas vs the previous round, "
        "labeled RL and the base model; pseudo-label calibration.",
        **_heavy(number),
    )
    def eval_report(
        context: dg.AssetExecutionContext,
        config: EvalConfig,
        student: Path,
        eval_problems: pl.DataFrame,
        pseudo_labels: LakeTable,
        labeled_only_eval: PublishedEval | None,
        stage_resources: StageResources,
        **baselines: PublishedEval | None,
    ):
        arm = context.partition_key
        reference_name = "previous_round" if number > 1 else "labeled_rl"
        teacher = baselines.pop("teacher", None)
        teacher_name = _taught_by(number, teacher)
        for name, found in (
            (labeled_only_eval_key.to_user_string(), labeled_only_eval),
            (reference_name, baselines[reference_name]),
            (teacher_name, baselines[teacher_name]),
        ):
            if found is None:
                raise dg.Failure(f"{name} (arm {arm}) is not materialized: the report compares with it")
        evidence = RoundEvidence(
            number,
            arm,
            pseudo_labels.frame,
            RoundLabels(pseudo_labels.extra_files, f"{layout.round_prefix(number)} pseudo-labels of arm {arm}"),
            labeled_only_eval,
            baselines[teacher_name],
            baselines,
            eval_problems,
            read_promotion(teacher) if teacher is not None else None,
        )
        with stage(context, config, stage_resources) as current:
            staged, metrics, health_check = evaluate(
                current,
                checkpoint_dir=student,
                eval_problems=eval_problems,
                deltas_against={
                    name: baselines[name]
                    for name in ("previous_round", "labeled_rl", "base_model")
                    if name in baselines
                },
                extras=partial(round_report, evidence),
            )
        yield current.output(staged, metadata=_explorer(arm, number) | {"taught_by": teacher_name})
        yield health_check
        yield no_eval_regression(
            report_key,
            metrics["greedy_accuracy"],
            baselines[reference_name].metrics["greedy_accuracy"],
            reference_name,
            current.settings.regression_tolerance,
        )

    return eval_report


def _student_validation_asset(number: int, _: AskedFor) -> dg.AssetsDefinition:
    """The round's student on the arm's validation problems (what patience and promotion read)."""
    return checkpoint_eval(
        round_key(number, layout.STUDENT_VALIDATION),
        round_key(number, layout.STUDENT),
        group=round_group(number),
        problems=layout.VALIDATION_PROBLEMS,
    )


ROUND_ASSETS: tuple[tuple[Callable[[int, AskedFor], dg.AssetsDefinition], Callable[[AskedFor], bool]], ...] = (
    (_generations_asset, lambda asked_for: True),
    (_verifier_asset, lambda asked_for: asked_for.verifier),
    (_verifier_scores_asset, lambda asked_for: asked_for.verifier),
    (_pseudo_labels_asset, lambda asked_for: True),
    (_student_asset, lambda asked_for: True),
    (_student_validation_asset, lambda asked_for: asked_for.round_validation),
    (_eval_report_asset, lambda asked_for: True),
)
"""A round's assets in dependency order: each one's factory (its inputs, its core call, its checks) and whether an
arm's experiment asks for it."""


def _taught_by(number: int, teacher: Path | None) -> str:
    """Whose evaluation round `number`'s flips are counted from: the eval input of the checkpoint its teacher copies
    (`labeled_rl`, `previous_round`, or an earlier round's prefix)."""
    if teacher is None:
        return "labeled_rl"
    source = first_made(teacher)
    if source.parent.name == layout.LABELED_RL:
        return "labeled_rl"
    taught = layout.round_number(source.parent.parent.name)
    return "previous_round" if taught == number - 1 else layout.round_prefix(taught)


def _explorer(arm: str, number: int) -> dict:
    """A link to the round's view in the explorer (`make explore`), as a materialization's metadata."""
    return {"explorer": dg.MetadataValue.url(explorer_link(arm, number))}


def train_from_student_init(current: StageRun, teacher: Path, base_model: Path, data: StudentData) -> Path:
    """Train (`current.settings`: `StudentSettings`) from where the round's student (and the gold- and
    random-label controls) start: the teacher or the base model."""
    init = teacher if current.settings.student_init == "teacher" else base_model
    return train_checkpoint(current, init_dir=init, data=data, settings=current.settings)


def kept_pseudo_labels(current: StageRun, labels: LakeTable, labels_key: dg.AssetKey) -> pl.DataFrame:
    """The kept pseudo-labels within the settings' agreement band, refused when their audit recorded a failed
    quality floor (the blocking check stops a run that made them; this stops one that materializes the
    student alone)."""
    from noisy_student_assets.core.pseudo_labels.student_data import in_agreement_band

    audit = PublishedAudit.from_files(labels.extra_files, f"{labels_key.to_user_string()} (arm {current.partition})")
    if audit.floor_failure:
        raise dg.Failure(
            f"{labels_key.to_user_string()} (arm {current.partition}) failed its quality floor: "
            f"{audit.floor_failure}; nothing is trained on them",
            allow_retries=False,  # the same labels would fail the same floor again
        )
    settings = current.settings
    kept = in_agreement_band(labels.frame.filter("kept"), settings.agreement_low, settings.agreement_high)
    current.metadata["pseudo_labels_in_band"] = kept.height
    if kept.is_empty():  # only reachable with min_coverage=0 or a narrow band: the user chose to go on without them
        warning = (
            f"no pseudo-label reached tau={audit.tau} within agreement "
            f"[{settings.agreement_low}, {settings.agreement_high}]: trained on labeled problems only"
        )
        current.context.log.warning(warning)
        current.metadata["warning"] = warning
    return kept


@dataclass(frozen=True)
class Sampling(HeavyStage[pl.DataFrame], seconds_name="sampling_seconds", publishes_staged=False):
    """The sampling stage (`core.sampling.sample_teacher`): the teacher's K samples of each problem, in as many
    parts as the launcher shards it into."""

    identical = "the same teacher weights, problems and sampling settings"
    teacher: Path
    teacher_label: str
    problems: pl.DataFrame
    """Only the columns sampling reads: the hidden gold must not reach the payload."""

    def stage(self, work_dir: Path, staged: Path) -> list:
        from noisy_student_assets.core.sampling import problem_parts

        settings, launcher = self.current.settings, self.current.resources.launcher
        self.current.context.log.info(
            f"Sampling {settings.k} answers for {self.problems.height} problems from {self.teacher}"
        )
        parts = problem_parts(self.problems, launcher.sampling_shards)
        if len(parts) > 1 and settings.backend != "vllm":
            raise dg.Failure(
                f"launcher.sampling_shards={len(parts)} needs the vllm backend: transformers' samples depend on the "
                "batch a problem is in",
                allow_retries=False,
            )
        specs = []
        for index, part in enumerate(parts):
            part_dir = work_dir / f"part-{index:03d}-of-{len(parts):03d}" if len(parts) > 1 else work_dir
            part_dir.mkdir(parents=True, exist_ok=True)
            part.write_parquet(part_dir / PROBLEMS_FILE)
            specs.append(
                SampleSpec(
                    teacher_dir=str(self.teacher),
                    problems=str(part_dir / PROBLEMS_FILE),
                    settings=settings,
                    checkpoint_label=self.teacher_label,
                    **self.payload_fields(part_dir),
                    output=str(staged / f"part-{index:03d}.parquet"),
                )
            )
        return specs

    def read(self, staged: Path, results: list[StageResult]) -> pl.DataFrame:
        return pl.concat([pl.read_parquet(staged / f"part-{index:03d}.parquet") for index in range(len(results))])

    def recall(self, published: Path) -> pl.DataFrame:
        # Bit-identical weights sampled them: they are this teacher's samples, and say so.
        return pl.read_parquet(published / layout.TABLE_FILE_NAME).with_columns(
            pl.lit(self.teacher_label).alias("checkpoint")
        )


@dataclass(frozen=True)
class VerifierTraining(HeavyStage[Path], seconds_name="verifier_seconds", publishes_staged=True):
    """The verifier stage (`core.training.verifier.build_verifier`): a reward model from the teacher, trained on its
    samples of the labeled problems and measured on its samples of the validation problems."""

    identical = "the same teacher weights, labeled and validation problems and verifier settings"
    teacher: Path
    labeled: pl.DataFrame
    validation: pl.DataFrame

    def stage(self, work_dir: Path, staged: Path) -> list:
        labeled, validation = work_dir / "labeled.parquet", work_dir / "validation.parquet"
        self.labeled.write_parquet(labeled)
        self.validation.write_parquet(validation)
        spec = VerifierSpec(
            teacher_dir=str(self.teacher),
            labeled=str(labeled),
            validation=str(validation),
            settings=self.current.settings,
            output_dir=str(staged),
            **self.payload_fields(work_dir),
        )
        return [spec]

    def read(self, staged: Path, results: list[StageResult]) -> Path:
        return staged

    def recall(self, published: Path) -> Path:
        return self.current.lake.stage_copy(published)


@dataclass(frozen=True)
class Scoring(HeavyStage[pl.DataFrame], seconds_name="scoring_seconds", publishes_staged=False):
    """The verifier's scoring (`core.training.verifier.score_round`): its score of each sample."""

    identical = "the same verifier and samples"
    verifier: Path
    samples: pl.DataFrame
    """Only what the verifier reads: the prompt and the sample (the hidden gold must not reach it)."""

    def stage(self, work_dir: Path, staged: Path) -> list:
        samples = work_dir / "samples.parquet"
        self.samples.write_parquet(samples)
        fields = self.payload_fields(work_dir)
        return [
            ScoreSpec(verifier_dir=str(self.verifier), samples=str(samples), output=str(staged / SCORES_FILE), **fields)
        ]

    def read(self, staged: Path, results: list[StageResult]) -> pl.DataFrame:
        return pl.read_parquet(staged / SCORES_FILE)

    def recall(self, published: Path) -> pl.DataFrame:
        return pl.read_parquet(published / layout.TABLE_FILE_NAME)


SCORES_FILE = "scores.parquet"
"""Where the scoring payload writes its table, in its staged directory."""
VERIFIER_READS = ("problem_id", "prompt", "gold_answer")
"""The columns of the labeled and validation problems the verifier stage reads, and its reuse is keyed by."""


def _content_key(*identity) -> str:
    """A sha256 of everything that shapes a stage's output (its first element names the stage, so that two stages'
    keys never meet)."""
    return hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()


def _sample(current: StageRun, teacher: Path, unlabeled: pl.DataFrame) -> LakeTable:
    """The teacher's K samples per problem, read back from any published sampling run with the same content key."""
    from noisy_student_assets.core.sampling import decoding, teacher_cache_key

    settings = current.settings
    teacher_sha = weights_sha256(teacher)
    cache_key = reuse_key(teacher_cache_key(teacher_sha, unlabeled, settings), settings)
    sampling = Sampling(
        current, cache_key, teacher, f"{teacher} sha256:{teacher_sha[:12]}", unlabeled.select("problem_id", "prompt")
    )
    ran = run_heavy(current, sampling)
    generations = ran.output
    stats = {}
    if ran.reused_from is None:
        resumed = sum(part.result["resumed_problems"] for part in ran.results)
        stats["resumed_problems"] = float(resumed)
        if resumed:
            current.context.log.info(
                f"Resumed {resumed}/{unlabeled.height} problems from the shards of an interrupted attempt"
            )
        else:  # tokens/s of an attempt that resumed would count tokens sampled by the one before
            stats["generated_tokens_per_second"] = generations["n_tokens"].sum() / current.metadata["sampling_seconds"]
    stats |= {
        "samples": generations.height,
        "answer_rate": generations["answer"].is_not_null().mean(),
        "truncated_rate": (generations["finish_reason"] == "length").mean(),
        "mean_tokens": generations["n_tokens"].mean(),
        "generated_tokens": float(generations["n_tokens"].sum()),
    }
    current.log_metrics(stats)
    current.metadata |= stats | {
        "reused_cached_samples": ran.reused_from is not None,
        "cache_key": cache_key,
        "teacher": dg.MetadataValue.path(str(teacher)),
        "teacher_weights_sha256": teacher_sha,
        "sampling": dg.MetadataValue.json(decoding(settings).as_dict() | {"backend": settings.backend}),
        "preview": markdown_table(generations.select("problem_id", "sample_index", "answer", "completion")),
    }
    return LakeTable(generations, {CONTENT_KEY_FILE: cache_key})


def _train_verifier(
    current: StageRun, teacher: Path, labeled: pl.DataFrame, validation: pl.DataFrame
) -> tuple[Path, dg.AssetCheckResult]:
    """The verifier, read back from an identical published one or trained, its validation figures as metadata and
    MLflow metrics, and the `verifier_informative` check."""
    from noisy_student_assets.core.training.verifier import read_verifier_metrics

    settings = current.settings
    teacher_sha = weights_sha256(teacher)
    labeled, validation = labeled.select(VERIFIER_READS), validation.select(VERIFIER_READS)
    content_key = _content_key(
        "verifier",
        teacher_sha,
        problems_fingerprint(labeled),
        problems_fingerprint(validation),
        settings.model_dump(),
        current.resources.compute.settings.dtype,
        prompt_template(),  # the teacher samples the problems it learns from as sampling does
    )
    verifier = VerifierTraining(current, reuse_key(content_key, settings), teacher, labeled, validation)
    staged = run_heavy(current, verifier).output
    metrics, failure = read_verifier_metrics(staged)
    current.log_metrics({f"verifier/{name}": value for name, value in metrics.items() if value is not None})
    current.metadata |= {name: value for name, value in metrics.items() if value is not None} | {
        "teacher": dg.MetadataValue.path(str(teacher)),
        "teacher_weights_sha256": teacher_sha,
    }
    if failure:
        current.context.log.error(f"verifier_informative fails: {failure}")
    return staged, verifier_informative(current.context.asset_key, failure, metrics)


def _score_samples(current: StageRun, verifier: Path, generations: pl.DataFrame, unlabeled: pl.DataFrame) -> LakeTable:
    """The verifier's score of every sample of the round, read back from an identical published scoring or computed;
    its validation figures travel beside the table, for the vote's report. The scoring has no settings of its own
    (the verifier's, in its measures file, are keyed with it), so no stage version: its key is its content key."""
    from noisy_student_assets.core.training.verifier import VERIFIER_METRICS_FILE

    measures = (verifier / VERIFIER_METRICS_FILE).read_text()
    samples = generations.select("problem_id", "sample_index", "completion").join(
        unlabeled.select("problem_id", "prompt"), on="problem_id", how="left"
    )
    content_key = _content_key(
        "verifier_scores",
        weights_sha256(verifier),
        measures,
        problems_fingerprint(samples),
        current.resources.compute.settings.dtype,
    )
    scores = run_heavy(current, Scoring(current, content_key, verifier, samples)).output
    current.metadata |= {
        "dagster/row_count": scores.height,
        "mean_score": scores["score"].mean(),
        "verifier": dg.MetadataValue.path(str(verifier)),
        "preview": markdown_table(scores),
    }
    return LakeTable(scores, {VERIFIER_METRICS_FILE: measures, CONTENT_KEY_FILE: content_key})


def _pseudo_label(
    current: StageRun, generations: pl.DataFrame, unlabeled: pl.DataFrame, verifier_scores: LakeTable | None
) -> tuple[LakeTable, dg.AssetCheckResult]:
    """The pseudo-label stage (`core.pseudo_labels.labels.pseudo_label`), its audit as metadata, MLflow table and
    sidecar files, and the `pseudo_label_quality` check."""
    import mlflow

    from noisy_student_assets.core.pseudo_labels.labels import VERIFIER_PREFIX, pseudo_label
    from noisy_student_assets.core.training.verifier import PublishedVerifier

    settings = current.settings
    scores = verifier_scores.frame if verifier_scores is not None else None
    try:
        with current.timed("consensus_seconds"):
            voted = pseudo_label(generations, unlabeled, settings, scores)
    except ValueError as cannot:  # a source without its input: the same inputs would fail again
        raise dg.Failure(str(cannot), allow_retries=False) from cannot
    labels, stats = voted.labels, dict(voted.stats)
    if verifier_scores is not None:
        verifier = PublishedVerifier.from_files(
            verifier_scores.extra_files, f"the verifier scores of arm {current.partition}"
        )
        stats |= {
            f"{VERIFIER_PREFIX}{name}": value
            for name, value in verifier.metrics.model_dump().items()
            if value is not None
        }
    current.log_metrics(stats)
    mlflow.log_table(voted.buckets.to_pandas(), artifact_file="label_audit_by_agreement.json")
    mlflow.log_table(voted.sources.to_pandas(), artifact_file="label_sources_at_matched_coverage.json")
    check = pseudo_label_quality(
        current.context.asset_key,
        voted.floor_failure,
        stats["coverage"],
        stats["mean_agreement"],
        settings.min_coverage,
        settings.min_mean_agreement,
    )
    kept = labels.filter("kept")
    current.context.log.info(
        f"{kept.height}/{labels.height} pseudo-labels kept at tau={settings.tau} ({settings.label_source}); "
        f"audit {stats}"
    )
    current.metadata |= stats | {
        "tau": settings.tau,
        "label_source": settings.label_source,
        "dagster/row_count": labels.height,
        "audit_by_agreement": markdown_table(voted.buckets, max_rows=voted.buckets.height),
        "label_sources_at_matched_coverage": markdown_table(voted.sources, max_rows=None),
        "preview": markdown_table(kept.select("problem_id", "pseudo_label", "agreement", "n_clusters")),
    }
    return LakeTable(labels, voted.sidecars(settings, stats)), check
