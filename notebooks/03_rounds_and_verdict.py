# ---
# jupyter:
#   jupytext:
#     notebook_metadata_filter: -jupytext.text_representation.jupytext_version
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Rounds and the verdict
#
# Did self-training help, and why? Each round's student is evaluated greedily on the held-out problems beside its
# **compute-matched controls**: the labeled-only control trains as long on the labeled problems alone (and, where
# the arm runs them, the gold-label and random-label controls train on the unlabeled problems with their hidden
# gold, or with random labels). A round helped only if it beats the labeled-only control at the same compute; the
# interval says whether the difference is more than the luck of the eval problems (and of the seed: one seed says
# nothing about seed-to-seed variation). The **flips** show where a round's gain comes from: the problems its teacher
# got wrong and the student right, against those it lost.
#
# Everything is read from the lake: the run summary's tables (`core/reporting/summary.py`), the verdict's intervals
# (`core/reporting/verdict.py`), the eval reports' flips and the checkpoints' `compute.json`.

# %% tags=["parameters"]
from noisy_student_assets.core import environment, layout
from noisy_student_assets.core.lake_reader import lake_rounds

LAKE = layout.default_lake_root()  # NOISY_STUDENT_DATA_LAKE, which `make setup` writes to .env
ARM = environment.inspected_arm(layout.DEFAULT_ARM)  # NOISY_STUDENT_ARM; `default` is the arm `make run` makes
ROUND = lake_rounds(LAKE).filter(arm=ARM)["round"].max()  # the arm's latest round: its flips and compute below

# %%
import polars as pl
from IPython.display import Image, Markdown, display

from noisy_student_assets.core.experiments.directory import default_experiments_dir
from noisy_student_assets.core.lake_reader import RoundLake
from noisy_student_assets.core.reporting import plots
from noisy_student_assets.core.reporting.inspection import flipped_problems, side_by_side
from noisy_student_assets.core.reporting.summary import accuracy_pivot, collect, lake_arms
from noisy_student_assets.core.reporting.verdict import paired_difference, paired_scores
from noisy_student_assets.core.training.compute import compute_comparison, recipe_mismatches

pl.Config.set_fmt_str_lengths(100)
pl.Config.set_tbl_rows(40)
arms, rounds = lake_arms(LAKE, default_experiments_dir())
(arm,) = [candidate for candidate in arms if candidate.name == ARM]
results = collect(LAKE, [arm], rounds)
display(Markdown("\n".join(f"- {sentence}" for sentence in results.sentences)))

# %% [markdown]
# ## Accuracy by round
#
# Greedy accuracy on the held-out problems; round 0 is labeled RL, where the student's chain and every control's
# start, with the base model dotted.

# %% tags=["main_figure"]
display(Image(plots.accuracy_by_round(results.accuracy)))
accuracy_pivot(results.accuracy)

# %% [markdown]
# ## With intervals
#
# Each round's student minus its teacher (labeled RL in round 1, the previous round's student after), paired by
# problem, with the verdict's 95% interval: what the round itself changed.

# %%
against_teacher = []
for number in range(1, ROUND + 1):
    round_lake = RoundLake(LAKE, ARM, number)
    student, teacher = round_lake.evaluation(layout.STUDENT_ROLE), round_lake.teacher_evaluation()
    if student and teacher:
        difference = paired_difference(
            *paired_scores([(student.scores, teacher.scores)]),
            treatment_name=f"round {number}'s student",
            control_name="its teacher",
        )
        against_teacher.append({"round": number} | difference.as_dict())
pl.DataFrame(against_teacher).drop("treatment", "control")

# %% [markdown]
# Each round's student minus each of its controls (the verdict's table; `compute_matched` says whether both spent the
# same optimizer steps, prompts and completions since the base model; `mde`: the smallest true effect its interval
# detects 80% of the time):

# %%
results.differences.select(
    "round", "control", "eval_set", "seeds", "problems", "estimate", "low", "high", "mde", "outcome", "compute_matched"
)

# %% [markdown]
# ## Flips
#
# The held-out problems whose greedy answer changed between each round's teacher and its student, as the eval
# reports count them; a gain is wrong-to-right flips outnumbering right-to-wrong ones, not a uniform shift.

# %%
results.flips

# %% [markdown]
# The flipped problems of the latest round, with both greedy answers:

# %%
round_lake = RoundLake(LAKE, ARM, ROUND)
eval_problems = round_lake.arm_lake.table(layout.EVAL_PROBLEMS).select("problem_id", "prompt", "gold_answer")
flipped_problems(round_lake).join(eval_problems, on="problem_id").select(
    "flip", "prompt", "gold_answer", "teacher/answer", "student/answer", pl.col("student/completion").str.slice(0, 80)
).sort("flip")

# %% [markdown]
# And where the latest round's student and its labeled-only control disagree on being right: the problems the
# pseudo-labels made the difference on, at the same compute.

# %%
versus = side_by_side(round_lake).join(eval_problems, on="problem_id")
versus.filter(pl.col("student/correct") != pl.col("labeled_only/correct")).select(
    "prompt", "gold_answer", "student/answer", "labeled_only/answer", "student/correct"
).sort("student/correct")

# %% [markdown]
# ## Compute-matched controls
#
# What each checkpoint of the latest round spent (`compute.json`): `own` is its own training run, `total` everything
# since the base model (labeled RL and the rounds before). The student and a control are compared at equal total
# optimizer steps, prompts and completions, trained the same way (the recipe); generated tokens differ by nature.

# %%
trained = {role: round_lake.trained(role) for role in (layout.STUDENT_ROLE, *layout.CONTROLS)}
spent = {role: checkpoint.compute for role, checkpoint in trained.items() if checkpoint is not None}
roles = list(spent)
pl.DataFrame(
    [
        {"checkpoint": role, "compute": part, **getattr(spent[role], part).as_dict()}
        for role in roles
        for part in ("own", "total")
    ]
)

# %%
student = round_lake.evaluation(layout.STUDENT_ROLE)
for control in roles[1:]:
    matched, table = compute_comparison(student.metrics, round_lake.evaluation(control).metrics)
    mismatches = recipe_mismatches(spent[control].recipe, spent[layout.STUDENT_ROLE].recipe)
    display(
        Markdown(
            f"**{control}**: {'compute-matched' if matched else 'NOT compute-matched'}; recipe "
            + ("; ".join(mismatches) or "the same")
        )
    )
    display(table.rename({"treatment": layout.STUDENT_ROLE, "control": control}))
