"""One arm's round as the lake holds it, for the people who inspect it (no Dagster here): the notebooks and the
explorer read a round through `lake_reader.RoundLake` and the functions below, which call the pipeline's own vote,
grader and sampler, so what they show is what the round computed.

    round_lake = RoundLake(layout.default_lake_root(), arm="default", number=1)
    votes = sample_votes(round_lake)    # each sample: its answer, right or not, its weight per label source
    labels = source_labels(round_lake)  # each problem: the label each source picks, kept or not, right or not
    side_by_side(round_lake)            # each held-out problem: the student's and the labeled-only control's greedy
                                        # answers
    flipped_problems(round_lake)        # the held-out problems the student got right and its teacher wrong, or the
                                        # reverse
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlencode

import polars as pl

from noisy_student_assets.core import environment, layout
from noisy_student_assets.core.grading import extract_answer
from noisy_student_assets.core.lake_reader import RoundLake
from noisy_student_assets.core.problems import HIDDEN_GOLD_COLUMN
from noisy_student_assets.core.pseudo_labels.labels import graded_samples, source_votes, with_label_correct
from noisy_student_assets.core.pseudo_labels.sources.registry import SOURCES
from noisy_student_assets.core.reporting.eval_report import PublishedEval

if TYPE_CHECKING:
    from transformers import PreTrainedModel

WEIGHT_PREFIX = "weight/"
"""`sample_votes`' column of each label source's weight of a sample: `weight/majority`."""
ROLES_SIDE_BY_SIDE = (layout.STUDENT_ROLE, layout.LABELED_ONLY)
LINK_PARAMETERS = ("arm", "round", "problem")
"""The query parameters of an explorer link: the arm, the round and the problem it opens on."""
TEACHER = "teacher"
WRONG_TO_RIGHT, RIGHT_TO_WRONG = "wrong_to_right", "right_to_wrong"
"""`flipped_problems`' flips, named as the eval report's flips table counts them."""


def sample_votes(round_lake: RoundLake) -> pl.DataFrame:
    """Each of the round's samples: its completion and answer, whether the answer matches the hidden gold
    (`correct`), and the weight each label source that can judge it gives it in the vote (`weight/<source>`)."""
    generations, settings, scores = round_lake.generations(), round_lake.labels().settings, round_lake.verifier_scores()
    columns = generations.select("problem_id", "sample_index", "completion", "answer", "mean_logprob", "finish_reason")
    samples = graded_samples(columns, round_lake.unlabeled_problems())
    for name, source in SOURCES.items():
        if source.missing_input(generations, scores) is None:
            weights = source.weighted(generations, settings, scores).select(
                "problem_id", "sample_index", pl.col("weight").alias(WEIGHT_PREFIX + name)
            )
            samples = samples.join(weights, on=["problem_id", "sample_index"], how="left")
    return samples.sort("problem_id", "sample_index")


def absent_sources(round_lake: RoundLake) -> dict[str, str]:
    """The label sources that cannot judge the round's samples, each with why: a verifier that the arm's own source
    does not read was never trained for it; otherwise the source's own reason (`missing_input`)."""
    generations, scores, settings = round_lake.generations(), round_lake.verifier_scores(), round_lake.labels().settings
    absent = {}
    for name, source in SOURCES.items():
        if reason := source.missing_input(generations, scores):
            if source.reads_verifier and name != settings.label_source:
                reason = (
                    f"this arm's label source, {settings.label_source}, reads no verifier, so its rounds train none "
                    "(an arm with label_source: verifier does)"
                )
            absent[name] = reason
    return absent


def source_labels(round_lake: RoundLake) -> pl.DataFrame:
    """Each unlabeled problem under each label source that can judge its samples: the label it picks, its agreement,
    whether it is kept at the round's tau, and whether it matches the hidden gold (`label_correct`); `chosen` marks
    the arm's own source, whose labels trained the student."""
    settings, unlabeled = round_lake.labels().settings, round_lake.unlabeled_problems()
    gold = dict(unlabeled.select("problem_id", HIDDEN_GOLD_COLUMN).iter_rows())
    votes = source_votes(round_lake.generations(), unlabeled, settings, round_lake.verifier_scores())
    columns = ("problem_id", "pseudo_label", "agreement", "kept", "label_correct")
    return pl.concat(
        [
            with_label_correct(vote, gold).select(
                pl.lit(name).alias("source"), pl.lit(name == settings.label_source).alias("chosen"), *columns
            )
            for name, vote in votes.items()
        ]
    )


def side_by_side(round_lake: RoundLake, roles: tuple[str, ...] = ROLES_SIDE_BY_SIDE) -> pl.DataFrame:
    """Each held-out problem with the greedy answer of each role's checkpoint (student, labeled-only control) and
    whether it was right, from their published evaluations; a role without one is left out."""
    table = None
    for role in roles:
        evaluation = round_lake.evaluation(role)
        if evaluation is None:
            continue
        answers = _greedy_answers_of(evaluation, role)
        table = answers if table is None else table.join(answers, on="problem_id", how="full", coalesce=True)
    return table if table is not None else pl.DataFrame(schema={"problem_id": pl.Utf8})


def _greedy_answers_of(evaluation: PublishedEval, name: str) -> pl.DataFrame:
    """Each problem's greedy answer in `evaluation`, its completion and whether it was right, as `<name>/...`
    columns."""
    greedy, _ = evaluation.completions()
    return greedy.select(
        "problem_id",
        pl.col("completion").map_elements(extract_answer, return_dtype=pl.Utf8).alias(f"{name}/answer"),
        pl.col("completion").alias(f"{name}/completion"),
    ).join(evaluation.scores.select("problem_id", pl.col("greedy_correct").alias(f"{name}/correct")), on="problem_id")


def flipped_problems(round_lake: RoundLake) -> pl.DataFrame:
    """The held-out problems whose greedy answer flipped between the round's teacher and its student (the flips its
    eval report counts): `flip` is `wrong_to_right` or `right_to_wrong`, beside both answers and completions."""
    teacher, student = round_lake.teacher_evaluation(), round_lake.evaluation(layout.STUDENT_ROLE)
    paired = _greedy_answers_of(teacher, TEACHER).join(
        _greedy_answers_of(student, layout.STUDENT_ROLE), on="problem_id"
    )
    before, after = pl.col(f"{TEACHER}/correct"), pl.col(f"{layout.STUDENT_ROLE}/correct")
    flip = pl.when(~before & after).then(pl.lit(WRONG_TO_RIGHT)).when(before & ~after).then(pl.lit(RIGHT_TO_WRONG))
    return (
        paired.with_columns(flip.alias("flip"))
        .drop_nulls("flip")
        .select("problem_id", "flip", pl.exclude("problem_id", "flip"))
    )


def greedy_answers(
    checkpoint_dir: Path, questions: list[str], max_new_tokens: int = 256, model: PreTrainedModel | None = None
) -> list[dict[str, str | None]]:
    """A checkpoint's greedy completion of each question and the answer the grader extracts from it, with the
    pipeline's prompt and sampler (transformers, CPU); `model`: the checkpoint's, already loaded
    (`sampling.load_transformers_model`), else it is loaded for these questions."""
    from noisy_student_assets.core.sampling import SamplingSettings, generate

    problems = pl.DataFrame({"problem_id": [str(index) for index in range(len(questions))], "prompt": questions})
    (table,), _ = generate(
        checkpoint_dir,
        problems,
        [SamplingSettings(n=1, temperature=0.0, max_new_tokens=max_new_tokens)],
        backend="transformers",
        model=model,
    )
    return [
        {"completion": completion, "answer": answer}
        for completion, answer in table.select("completion", "answer").iter_rows()
    ]


def vote_summary(votes: pl.DataFrame, problem_id: str) -> pl.DataFrame:
    """One problem's vote per distinct answer text (the vote itself groups equivalent answers): how many samples gave
    it, whether it is right, and its share of each source's total weight."""
    samples = votes.filter(pl.col("problem_id") == problem_id)
    weights = [column for column in samples.columns if column.startswith(WEIGHT_PREFIX)]
    return (
        samples.group_by("answer", maintain_order=True)
        .agg(pl.len().alias("samples"), pl.col("correct").any(), *[pl.col(column).sum() for column in weights])
        .with_columns(
            [
                (pl.col(column) / samples[column].sum()).alias(column.replace(WEIGHT_PREFIX, "share/"))
                for column in weights
            ]
        )
        .drop(weights)
        .sort("samples", descending=True)
    )


def problem_record(round_lake: RoundLake, problem_id: str) -> dict:
    """An unlabeled problem's prompt and hidden gold (the audit's)."""
    row = round_lake.unlabeled_problems().filter(pl.col("problem_id") == problem_id).row(0, named=True)
    return {"problem_id": problem_id, "prompt": row["prompt"], "hidden_gold": row[HIDDEN_GOLD_COLUMN]}


def explorer_link(arm: str, number: int, problem_id: str | None = None) -> str:
    """The explorer's view of round `number` of `arm` (and of one of its problems), where
    `NOISY_STUDENT_EXPLORER_URL` says the explorer serves."""
    named = dict(zip(LINK_PARAMETERS, (arm, number, problem_id), strict=True))
    query = urlencode({name: value for name, value in named.items() if value is not None})
    return f"{environment.explorer_url()}/?{query}"


def linked_view(query: Mapping[str, str]) -> tuple[str | None, int | None, str | None]:
    """The (arm, round, problem) an explorer link's query names (`explorer_link`); None for what it leaves out, and
    for a round that is not a number."""
    arm, number, problem_id = (query.get(name) or None for name in LINK_PARAMETERS)
    return arm, int(number) if number and number.isdigit() else None, problem_id
