"""The explorer (`make explore`): a web page over the lake for a person asking what a round did, read through the
core's inspection API (`core.reporting.inspection`), so what it shows is what the round computed.

    python -m noisy_student_assets.explorer [--lake DIR] [--port 7860] [--host 127.0.0.1]

"A round's problems": an arm's round and one of its unlabeled problems: the teacher's K samples with their answers,
right or not, and the weight each label source gives them; each source's vote; the kept label; the hidden gold (the
audit's, which no vote reads); the student's and the labeled-only control's greedy answers, asked on demand; and
both checkpoints' answers on the held-out problems, from their evaluations. "Ask two checkpoints": a question of
one's own, answered by any two of the lake's checkpoints side by side. A checkpoint is loaded on CPU when asked, and
each answer is kept for the page's next ask. A link `?arm=default&round=1&problem=...` opens on that view (the
Dagster UI's `explorer` metadata links here).
"""

from __future__ import annotations

import argparse
import threading
from collections import OrderedDict
from functools import lru_cache
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING

import gradio as gr
import polars as pl

from noisy_student_assets.core import layout
from noisy_student_assets.core.grading import answers_equivalent
from noisy_student_assets.core.lake_reader import (
    BASE_MODEL_NAME,
    RoundLake,
    checkpoint_version,
    lake_checkpoints,
    lake_rounds,
)
from noisy_student_assets.core.pseudo_labels.sources.registry import SOURCES
from noisy_student_assets.core.reporting.inspection import (
    absent_sources,
    greedy_answers,
    linked_view,
    problem_record,
    sample_votes,
    side_by_side,
    source_labels,
    vote_summary,
)
from noisy_student_assets.core.sampling import load_transformers_model
from noisy_student_assets.core.settings import EvalSettings

if TYPE_CHECKING:
    from transformers import PreTrainedModel

TITLE = "noisy-student explorer"
NO_ROUND = "No round in this lake yet: `make run` makes one."
ANSWER_ROLES = (layout.STUDENT_ROLE, layout.LABELED_ONLY)
AUDIT_FIGURES = (
    "coverage",
    "kept_label_accuracy",
    "all_label_accuracy",
    "teacher_pass_at_1",
    "teacher_maj_at_k",
    "teacher_pass_at_k",
)
"""The audit's figures the round's header shows (the rest are the verifier's, in the Dagster UI)."""
AGAINST_GOLD = {
    True: " ✓ (the hidden gold)",
    False: " ✗ (not the hidden gold)",
    None: " ? (ungraded: the grader timed out)",
}
RIGHT_MARKS = {True: "✓", False: "✗", None: "?"}
"""The hidden gold's verdict on a label: right, wrong, or ungraded (the grader timed out)."""
PROBLEM_LIST_LABEL = "Unlabeled problem (the arm's label kept or not at tau; ✓ right, ✗ wrong by the hidden gold)"
SAMPLE_CELL_CHARACTERS = 160
"""The samples table shows this much of a completion (a click on the cell shows it all), so that a long one does not
crowd the other columns off a 1600-pixel page."""
COMPLETION_SHARE = 40
"""The completion's share of the samples table's width, in percent; the other columns share the rest."""
PROGRESS = gr.Progress()
"""The default of every event's `progress`: Gradio gives each call its own bar, shown on the event's outputs."""
ANSWER_HEIGHT = 120
"""The least height of an answer's box, in pixels: an ask's progress is drawn over its answers, and an empty
Markdown has no height to draw it in."""
# System fonts: the default theme fetches its fonts from Google, which an offline machine cannot reach.
THEME = gr.themes.Default(font=["ui-sans-serif", "system-ui", "sans-serif"], font_mono=["ui-monospace", "monospace"])


@lru_cache(maxsize=8)
def _round_votes(round_lake: RoundLake, version: int) -> tuple[pl.DataFrame, pl.DataFrame, dict[str, str]]:
    """A round's samples, graded and weighed, each source's labels, and the sources that could not judge them with
    why (seconds to grade: read once per round); `version` (the vote table's modification time) reads a
    re-materialized round afresh."""
    return sample_votes(round_lake), source_labels(round_lake), absent_sources(round_lake)


@lru_cache(maxsize=256)
def _answer(checkpoint: Path, version: int, question: str, max_new_tokens: int) -> dict[str, str | None]:
    """A checkpoint's greedy answer to a question; `version` (its config's modification time) asks a re-trained one
    afresh."""
    (answer,) = greedy_answers(checkpoint, [question], max_new_tokens=max_new_tokens, model=_model(checkpoint, version))
    return answer


_MODELS: OrderedDict[tuple[Path, int], PreTrainedModel] = OrderedDict()
_MODELS_LOCK = threading.Lock()
MODELS_KEPT = 4
"""Checkpoints kept loaded at once (the last asked): a round's student and control, and the two a question was put
to."""


def _model(checkpoint: Path, version: int) -> PreTrainedModel:
    """A checkpoint's model, loaded once and kept for the questions put to it after (`MODELS_KEPT`); `version` (its
    config's modification time) loads a re-trained one afresh."""
    key = (checkpoint, version)
    with _MODELS_LOCK:  # two events at once (a round's ask and a question of one's own) load a checkpoint once
        if key not in _MODELS:
            _MODELS[key] = load_transformers_model(checkpoint)
            while len(_MODELS) > MODELS_KEPT:
                _MODELS.popitem(last=False)
        _MODELS.move_to_end(key)
        return _MODELS[key]


def _readable(frame: pl.DataFrame) -> pl.DataFrame:
    """Booleans as ✓ / ✗, numbers to three places and a missing answer as a dash, for the eye."""
    return frame.with_columns(
        pl.col(pl.Boolean).replace_strict({True: "✓", False: "✗"}, default="", return_dtype=pl.Utf8),
        pl.col(pl.Float32, pl.Float64).round(3),
        pl.col(pl.Utf8).fill_null("—"),
    )


class Explorer:
    """The lake at `root`, as the page shows it; checkpoints answer with at most `max_new_tokens` tokens."""

    def __init__(self, root: Path, max_new_tokens: int) -> None:
        self.root, self.max_new_tokens = root, max_new_tokens

    def rounds(self) -> pl.DataFrame:
        return lake_rounds(self.root)

    def round_numbers(self, arm: str) -> list[int]:
        return self.rounds().filter(pl.col("arm") == arm)["round"].to_list()

    def round_lake(self, arm: str, number: int) -> RoundLake:
        return RoundLake(self.root, arm, int(number))

    def votes(self, round_lake: RoundLake) -> tuple[pl.DataFrame, pl.DataFrame, dict[str, str]]:
        return _round_votes(round_lake, round_lake.labels().version)

    def problems(self, round_lake: RoundLake) -> list[tuple[str, str]]:
        """The round's unlabeled problems as (its id, whether the arm's label was kept and is right by the hidden
        gold, the first words of the question; its id)."""
        _, labels, _ = self.votes(round_lake)
        chosen = labels.filter("chosen").select("problem_id", "kept", "label_correct")
        unlabeled = round_lake.unlabeled_problems().join(chosen, on="problem_id", how="left", maintain_order="left")
        return [
            (
                f"{problem_id} · {'kept' if kept else 'not kept'} {RIGHT_MARKS[right]}: "
                f"{' '.join(prompt.split())[:80]}",
                problem_id,
            )
            for problem_id, prompt, kept, right in unlabeled.select(
                "problem_id", "prompt", "kept", "label_correct"
            ).iter_rows()
        ]

    def answer(self, checkpoint: Path, question: str) -> dict[str, str | None]:
        return _answer(checkpoint, checkpoint_version(checkpoint), question, self.max_new_tokens)

    def asking(self, name: str, checkpoint: Path) -> str:
        """What the progress bar says while `checkpoint` answers: whether it is loaded first."""
        loaded = (checkpoint, checkpoint_version(checkpoint)) in _MODELS
        return f"Asking {name}" + ("" if loaded else " (loading it on CPU: once, then it is kept)")

    def ask_round_checkpoints(self, arm_name: str, round_number: int, problem_id: str, progress=PROGRESS) -> list[str]:
        """The round's student's and labeled-only control's greedy answers to one of its unlabeled problems."""
        round_lake = self.round_lake(arm_name, round_number)
        record = problem_record(round_lake, problem_id)
        texts = []
        for index, role in enumerate(ANSWER_ROLES):
            checkpoint = round_lake.checkpoint(role)
            name = f"Round {round_number} {role}"
            if checkpoint_version(checkpoint) is not None:
                progress((index, len(ANSWER_ROLES)), desc=self.asking(name, checkpoint), unit="checkpoints")
                texts.append(_answer_text(name, self.answer(checkpoint, record["prompt"]), record["hidden_gold"]))
            else:
                texts.append(f"### {name}\n\nNot in the lake.")
        return texts

    def ask_two(self, left_name: str, right_name: str, text: str, progress=PROGRESS) -> list[str]:
        """Two of the lake's checkpoints' greedy answers to a question of one's own."""
        if not (left_name and right_name and text.strip()):
            return ["Pick two checkpoints and type a question.", ""]
        checkpoints = lake_checkpoints(self.root)
        texts = []
        for index, name in enumerate((left_name, right_name)):
            progress((index, 2), desc=self.asking(name, checkpoints[name]), unit="checkpoints")
            texts.append(_answer_text(name, self.answer(checkpoints[name], text)))
        return texts

    def problem_view(
        self, round_lake: RoundLake, problem_id: str
    ) -> tuple[str, str, str, pl.DataFrame, str, pl.DataFrame, pl.DataFrame]:
        """The problem's question, hidden gold and kept label, each source's vote and which sources the round has,
        the vote per answer and the samples."""
        votes, labels, _ = self.votes(round_lake)
        record = problem_record(round_lake, problem_id)
        settings = round_lake.labels().settings
        by_source = labels.filter(pl.col("problem_id") == problem_id).drop("problem_id")
        chosen = by_source.filter("chosen").row(0, named=True)
        if chosen["kept"]:
            kept = (
                f"Kept label ({settings.label_source}, the arm's source): **{chosen['pseudo_label']}**, "
                f"agreement {chosen['agreement']:.2f} ≥ tau {settings.tau}"
            )
        else:
            kept = (
                f"No label kept: {settings.label_source}'s agreement {chosen['agreement']:.2f} < tau {settings.tau} "
                "(the student trains without this problem)"
            )
        by_source = by_source.with_columns(
            pl.when("chosen").then(pl.col("source") + " (the arm's)").otherwise("source").alias("source")
        ).select(
            pl.col("source").alias("label source"),
            pl.col("pseudo_label").alias("label"),
            "agreement",
            pl.col("kept").alias(f"kept (≥ {settings.tau})"),
            pl.col("label_correct").alias("right (audit)"),
        )
        samples = votes.filter(pl.col("problem_id") == problem_id).select(
            pl.col("sample_index").alias("sample"),
            "answer",
            pl.col("correct").alias("right (audit)"),
            pl.col("^weight/.*$"),
            pl.col("mean_logprob").alias("mean log-prob"),
            pl.col("finish_reason").alias("finish"),
            "completion",
        )
        summary = vote_summary(votes, problem_id).rename({"correct": "right (audit)"})
        return (
            record["prompt"],
            record["hidden_gold"],
            kept,
            _readable(by_source),
            self.sources_note(round_lake),
            _readable(summary),
            _readable(samples),
        )

    def sources_note(self, round_lake: RoundLake) -> str:
        """Which label sources judged the round's samples, the arm's own named, and why any other is absent."""
        _, _, absent = self.votes(round_lake)
        own = round_lake.labels().settings.label_source
        present = [f"{name} (the arm's)" if name == own else name for name in SOURCES if name not in absent]
        lines = [f"Label sources of this round: {', '.join(present)}."]
        lines += [f"- **{name}** is absent: {reason}." for name, reason in absent.items()]
        return "\n".join(lines)

    def round_header(self, round_lake: RoundLake) -> str:
        """The round's vote settings and its audit's figures."""
        labels = round_lake.labels()
        settings, figures = labels.settings, labels.audit
        audited = ", ".join(
            f"{name} {getattr(figures, name):.3f}" for name in AUDIT_FIGURES if getattr(figures, name) is not None
        )
        return (
            f"**Round {round_lake.number} of arm {round_lake.arm}**: label source {settings.label_source}, "
            f"tau {settings.tau}. The audit (hidden gold): {audited}."
        )

    def held_out(self, round_lake: RoundLake) -> tuple[str, pl.DataFrame]:
        """Both checkpoints' greedy answers on the held-out problems (their evaluations'), with each one's count
        right."""
        table = side_by_side(round_lake)
        counts = ", ".join(
            f"{role} right on {table[f'{role}/correct'].sum()} of {table.height}"
            for role in ANSWER_ROLES
            if f"{role}/correct" in table.columns
        )
        text = f"**Held-out problems** (greedy answers, from the evaluations): {counts or 'no evaluation yet'}."
        return text, _readable(table.select(pl.exclude("^.*/completion$")))


def sample_widths(columns: list[str]) -> list[str]:
    """The samples table's column widths: the completion takes what the narrow columns leave."""
    return [
        f"{COMPLETION_SHARE}%" if name == "completion" else f"{(100 - COMPLETION_SHARE) // (len(columns) - 1)}%"
        for name in columns
    ]


def _answer_text(name: str, answer: dict[str, str | None], gold: str | None = None) -> str:
    """A checkpoint's answer and completion; against the hidden gold where it is given."""
    verdict = "" if gold is None else AGAINST_GOLD[answers_equivalent(gold, answer["answer"])]
    return f"### {name}\n\n**Answer:** `{answer['answer']}`{verdict}\n\n```\n{answer['completion']}\n```"


def build(explorer: Explorer) -> gr.Blocks:
    """The page: its two views and the events that fill them."""
    with gr.Blocks(title=TITLE, analytics_enabled=False) as page:
        gr.Markdown(f"# {TITLE}\n\nThe lake at `{explorer.root}`.")
        view, ask = _round_tab(), _ask_tab()
        problem_outputs = [
            *(view.question, view.gold, view.kept, view.by_source, view.sources, view.summary, view.samples),
            *(view.student_answer, view.control_answer),
        ]
        round_outputs = [view.header, view.held_out_text, view.held_out]

        def show_problem(arm_name, round_number, problem_id, progress=PROGRESS):
            if not problem_id:
                return [gr.update()] * len(problem_outputs)
            progress(0, desc=f"Reading problem {problem_id}")
            *shown, samples_table = explorer.problem_view(explorer.round_lake(arm_name, round_number), problem_id)
            return [*shown, gr.update(value=samples_table, column_widths=sample_widths(samples_table.columns)), "", ""]

        def show_round(arm_name, round_number, problem_id=None, progress=PROGRESS):
            """The round's problem choices (on `problem_id`, else its first), the problem's view, the round's header and
            its held-out table."""
            progress(0, desc=f"Reading round {round_number} of arm {arm_name}: grading its samples (once a round)")
            round_lake = explorer.round_lake(arm_name, round_number)
            choices = explorer.problems(round_lake)
            if problem_id not in {value for _, value in choices}:
                problem_id = choices[0][1] if choices else None
            return [
                gr.update(choices=choices, value=problem_id),
                *show_problem(arm_name, round_number, problem_id, progress),
                explorer.round_header(round_lake),
                *explorer.held_out(round_lake),
            ]

        def show_arm(arm_name, round_number=None, problem_id=None, progress=PROGRESS):
            numbers = explorer.round_numbers(arm_name)
            round_number = round_number if round_number in numbers else numbers[-1]
            return [
                gr.update(choices=numbers, value=round_number),
                *show_round(arm_name, round_number, problem_id, progress),
            ]

        def open_page(request: gr.Request, progress=PROGRESS):
            """The lake as it is now, on the view the link names (else the first arm's latest round)."""
            rounds, checkpoints = explorer.rounds(), list(lake_checkpoints(explorer.root))
            pair = _default_pair(checkpoints)
            asked = [gr.update(choices=checkpoints, value=pair[0]), gr.update(choices=checkpoints, value=pair[1])]
            arms = sorted(set(rounds["arm"]))
            if not arms:
                return [
                    gr.update(choices=[]),
                    *[NO_ROUND if component is view.header else gr.update() for component in arm_outputs],
                    *asked,
                ]
            arm_name, round_number, problem_id = linked_view(request.query_params)
            arm_name = arm_name if arm_name in arms else arms[0]
            return [
                gr.update(choices=arms, value=arm_name),
                *show_arm(arm_name, round_number, problem_id, progress),
                *asked,
            ]

        arm_outputs = [view.number, view.problem, *problem_outputs, *round_outputs]
        page.load(open_page, outputs=[view.arm, *arm_outputs, ask.left, ask.right])
        view.arm.input(show_arm, inputs=[view.arm], outputs=arm_outputs)
        view.number.input(
            show_round, inputs=[view.arm, view.number], outputs=[view.problem, *problem_outputs, *round_outputs]
        )
        view.problem.input(show_problem, inputs=[view.arm, view.number, view.problem], outputs=problem_outputs)
        view.ask_round.click(
            explorer.ask_round_checkpoints,
            inputs=[view.arm, view.number, view.problem],
            outputs=[view.student_answer, view.control_answer],
        )
        ask.ask_both.click(
            explorer.ask_two,
            inputs=[ask.left, ask.right, ask.own_question],
            outputs=[ask.left_answer, ask.right_answer],
        )
    return page


def _round_tab() -> SimpleNamespace:
    """The tab of a round's problems: its components, by name."""
    with gr.Tab("A round's problems"):
        with gr.Row():
            arm = gr.Dropdown(label="Arm", choices=[])
            number = gr.Dropdown(label="Round", choices=[])
            problem = gr.Dropdown(label=PROBLEM_LIST_LABEL, choices=[], scale=3)
        header = gr.Markdown()
        question = gr.Textbox(label="Question", lines=2, interactive=False)
        with gr.Row():
            gold = gr.Textbox(
                label="Hidden gold (the audit's only: no vote reads it)", interactive=False, elem_id="hidden-gold"
            )
            kept = gr.Markdown(elem_id="kept-label")
        by_source = gr.Dataframe(label="The vote per label source", interactive=False, elem_id="votes-by-source")
        sources = gr.Markdown(elem_id="label-sources")
        summary = gr.Dataframe(
            label="The K samples' answers: how many gave each, and its share of each source's weight",
            interactive=False,
        )
        samples = gr.Dataframe(
            label=f"The teacher's K samples, with each label source's weight (a completion's first "
            f"{SAMPLE_CELL_CHARACTERS} characters: click it for the rest)",
            interactive=False,
            wrap=True,
            max_chars=SAMPLE_CELL_CHARACTERS,
            elem_id="samples",
        )
        ask_round = gr.Button(
            "Ask the round's student and its labeled-only control (greedy, on CPU)", variant="primary"
        )
        with gr.Row():
            student_answer = gr.Markdown(elem_id="student-answer", min_height=ANSWER_HEIGHT)
            control_answer = gr.Markdown(elem_id="control-answer", min_height=ANSWER_HEIGHT)
        held_out_text = gr.Markdown()
        held_out = gr.Dataframe(
            label="Held-out problems: student vs labeled-only control", interactive=False, elem_id="held-out"
        )
    return SimpleNamespace(
        arm=arm,
        number=number,
        problem=problem,
        header=header,
        question=question,
        gold=gold,
        kept=kept,
        by_source=by_source,
        sources=sources,
        summary=summary,
        samples=samples,
        ask_round=ask_round,
        student_answer=student_answer,
        control_answer=control_answer,
        held_out_text=held_out_text,
        held_out=held_out,
    )


def _ask_tab() -> SimpleNamespace:
    """The tab that asks two checkpoints a question of one's own: its components, by name."""
    with gr.Tab("Ask two checkpoints"):
        with gr.Row():
            left = gr.Dropdown(label="Checkpoint", choices=[], elem_id="left-checkpoint")
            right = gr.Dropdown(label="Checkpoint", choices=[], elem_id="right-checkpoint")
        own_question = gr.Textbox(label="Your question", lines=3, elem_id="own-question")
        ask_both = gr.Button("Ask both (greedy, on CPU)", variant="primary")
        with gr.Row():
            left_answer = gr.Markdown(elem_id="left-answer", min_height=ANSWER_HEIGHT)
            right_answer = gr.Markdown(elem_id="right-answer", min_height=ANSWER_HEIGHT)
    return SimpleNamespace(
        left=left,
        right=right,
        own_question=own_question,
        ask_both=ask_both,
        left_answer=left_answer,
        right_answer=right_answer,
    )


def _default_pair(checkpoints: list[str]) -> tuple[str | None, str | None]:
    """The pair a question is first put to: the latest round's student and its labeled-only control (else its arm's
    base model), else the first two."""
    students = [name for name in checkpoints if name.endswith(f"/ {layout.STUDENT_ROLE}")]
    if students:
        control = students[-1].removesuffix(layout.STUDENT_ROLE) + layout.LABELED_ONLY
        base_model = f"{students[-1].split(' / ')[0]} / {BASE_MODEL_NAME}"
        return students[-1], control if control in checkpoints else base_model
    padded = [*checkpoints, None, None]
    return padded[0], padded[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--lake", type=Path, default=layout.default_lake_root(), help="the data lake (default: NOISY_STUDENT_DATA_LAKE)"
    )
    parser.add_argument("--port", type=int, default=7860)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument(
        "--max-new-tokens",
        type=int,
        default=EvalSettings().max_new_tokens,
        help="completion tokens at most (default: the evaluations' own)",
    )
    args = parser.parse_args()
    build(Explorer(args.lake.resolve(), args.max_new_tokens)).launch(
        server_name=args.host, server_port=args.port, theme=THEME
    )


if __name__ == "__main__":
    main()
