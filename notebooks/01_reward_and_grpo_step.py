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
# # The reward and one GRPO step
#
# What every training run of this project optimizes, on the toy task (two-digit sums): the **reward** the project's
# grader gives a completion, a **group** of completions of one prompt, each completion's **advantage** within its
# group, and the **clipped loss** of one optimizer step of TRL's `GRPOTrainer`, run through the project's own
# training entry point (`core/training/grpo.py`) from the lake's base model on a few of the arm's labeled problems.
#
# Nothing here is reimplemented: the grader is `core/grading.py`, the reward function the one TRL calls in every
# run (`grpo.answer_reward`), the training rows are built as labeled RL builds them (`student.training_set`), and
# the group, rewards and advantages are read back from what TRL logged during the step.

# %% tags=["parameters"]
from noisy_student_assets.core import environment, layout
from noisy_student_assets.core.settings import TRL_ROLLOUTS, LabeledRLSettings

LAKE = layout.default_lake_root()  # NOISY_STUDENT_DATA_LAKE, which `make setup` writes to .env
ARM = environment.inspected_arm(layout.DEFAULT_ARM)  # NOISY_STUDENT_ARM; `default` is the arm `make run` makes
# Labeled RL's own GRPO settings (the profile's learning rate, LoRA and loss), cut to a smaller step than the
# pipeline's so that the notebook runs in seconds on a 2-core CPU: one step, no TRL checkpoint, groups of 4
# completions of at most 48 tokens, sampled by TRL's own generation (the pipeline's vLLM engine takes longer to start
# than this whole step takes), so without the validation checks that run through that engine.
GRPO = LabeledRLSettings().grpo.model_copy(
    update={
        "max_steps": 1,
        "save_steps": 0,
        "num_generations": 4,
        "max_completion_length": 48,
        "rollouts": TRL_ROLLOUTS,
        "validation_every": 0,
    }
)

# %%
import tempfile
from pathlib import Path

import polars as pl
from IPython.display import Image, display

from noisy_student_assets.core import grading
from noisy_student_assets.core.lake_reader import ArmLake
from noisy_student_assets.core.reporting import plots
from noisy_student_assets.core.settings import ComputeSettings, StudentSettings
from noisy_student_assets.core.training.base import TrainingRun, step_line, step_logs_callback
from noisy_student_assets.core.training.compute import grpo_compute
from noisy_student_assets.core.training.grpo import answer_reward, logged_completions, train_grpo
from noisy_student_assets.core.training.modes.base import StudentData
from noisy_student_assets.core.training.student import training_set

pl.Config.set_fmt_str_lengths(120)
pl.Config.set_tbl_rows(40)
labeled = ArmLake(LAKE, ARM).table(layout.LABELED_PROBLEMS)
labeled.head(GRPO.prompts_per_step)

# %% [markdown]
# ## The reward
#
# A completion earns 1 when the final answer it states is mathematically equivalent to the row's target (the gold
# answer of a labeled problem, the pseudo-label of an unlabeled one), 0 when it is not, and `None` (*ungraded*) when
# math-verify could not finish the check; TRL leaves an ungraded completion out of its group's baseline. The answer
# is extracted in order of precedence: the last `<answer>...</answer>`, the last `\boxed{...}`, a GSM8K `#### ...`
# line, else the last number in the text. So the reward is verifiable and cheap, but it reads only the final
# answer: a completion that reasons badly and lands on the right number is paid in full.
#
# Hand-written completions of the first labeled problem, graded by the reward function TRL calls in every run:

# %%
problem = labeled.row(0, named=True)
gold = problem["gold_answer"]
print(f"{problem['prompt']}  (gold answer: {gold})")
completions = {
    "boxed, right": f"First add the tens, then the ones: \\boxed{{{gold}}}.",
    "plain number, right": f"The sum is {gold}.",
    "boxed wins over a later number": f"\\boxed{{{gold}}}, checked 2 times.",
    "equivalent, another form": f"\\boxed{{{gold}.0}}",
    "wrong": f"\\boxed{{{gold}1}}",
    "no answer": "I am not sure how to add these.",
}
pl.DataFrame(
    {
        "completion": list(completions.values()),
        "what": list(completions),
        "extracted answer": [grading.extract_answer(text) for text in completions.values()],
        "reward": answer_reward(list(completions.values()), [gold] * len(completions)),
    }
)

# %% [markdown]
# ## One GRPO step
#
# GRPO (Shao et al. 2024, DeepSeekMath) needs no value model: for each prompt it samples a **group** of
# `num_generations` completions, and a completion's **advantage** is its reward against its own group's:
# `(reward - group mean) / (group std + 1e-4)` with `scale_rewards="group"`. A group whose completions are all right,
# or all wrong, has advantage 0 everywhere: it teaches nothing (TRL logs the share of such groups as
# `frac_reward_zero_std`). A problem is useful to GRPO only where the policy sometimes solves it.
#
# The step below trains `prompts_per_step` labeled problems x `num_generations` completions from the lake's base
# model, with LoRA where the profile uses it, as each of labeled RL's steps does (`train_grpo`, the function
# every GRPO run of the pipeline calls). `log_completions` has TRL keep the step's groups with their rewards and
# advantages, which `logged_completions` reads back.

# %%
compute = ComputeSettings()
dataset = training_set(StudentSettings(grpo=GRPO), StudentData(labeled=labeled.head(GRPO.prompts_per_step)))
print(
    f"Loading the base model, then {GRPO.max_steps} step(s) of {GRPO.prompts_per_step} prompts x "
    f"{GRPO.num_generations} completions (a line per step):"
)
with tempfile.TemporaryDirectory() as scratch:
    work_dir = Path(scratch) / "work"
    result = train_grpo(
        ArmLake(LAKE, ARM).artifact_dir(layout.BASE_MODEL),
        dataset,
        GRPO,
        Path(scratch) / "trained",
        TrainingRun(
            work_dir,
            device=compute.resolved_device(),
            dtype=compute.dtype,
            callbacks=(step_logs_callback(lambda *step: print(step_line(*step))),),
        ),
        log_completions=True,
    )
    groups = logged_completions(work_dir)
groups.select(
    "question",
    pl.col("completion").map_elements(grading.extract_answer, return_dtype=pl.Utf8).alias("answer"),
    "answer_reward",
    "advantage",
    pl.col("completion").str.slice(0, 80),
)

# %% tags=["main_figure"]
display(Image(plots.grpo_groups(groups)))

# %% [markdown]
# The advantages TRL computed are the group-relative rewards above; recomputed from the logged rewards as a check
# (the standard deviation with Bessel's correction, `ddof=1`, as TRL's):

# %%
groups.select(
    "question",
    "answer_reward",
    "advantage",
    (
        (pl.col("answer_reward") - pl.col("answer_reward").mean().over("question"))
        / (pl.col("answer_reward").std().over("question") + 1e-4)
    ).alias("(reward - group mean) / (group std + 1e-4)"),
)

# %% [markdown]
# ## The clipped loss, and what TRL logged
#
# For every completion token, GRPO weighs the token's log-probability by the completion's advantage through the
# importance ratio `r = pi_theta(token) / pi_old(token)` between the policy being updated and the one that sampled,
# PPO's clipped objective `min(r * A, clip(r, 1 - epsilon, 1 + epsilon) * A)`; `loss_type="dapo"` averages it over
# every token of the step, so longer completions weigh more. With `beta = 0` there is no KL term and no reference
# model.
#
# Here, as in every run of the pipeline, each generated batch is trained on once (`num_iterations = 1`): at the step
# `pi_old` *is* `pi_theta`, every ratio is exactly 1 and nothing is clipped, so the `clip_ratio/*` metrics read 0
# and the gradient is the plain policy gradient weighted by the advantages. Clipping starts to matter when a batch
# is reused for several updates, or sampled by another engine than the one trained. For the same reason the logged
# `loss` is not a measure of progress: it is minus the token-weighted mean advantage, 0 wherever a group's
# completions are equally long.
#
# TRL's metrics of the step (the pipeline logs the same ones to MLflow for every run): `reward` and `reward_std` are
# the mean and spread of the step's rewards, `frac_reward_zero_std` the share of groups without signal,
# `completions/mean_length` and `completions/clipped_ratio` how long the completions were and how many hit
# `max_completion_length`:

# %%
(step,) = [entry for entry in result.log_history if "reward" in entry]
pl.DataFrame({"metric": list(step), "value": [None if value is None else float(value) for value in step.values()]})

# %% [markdown]
# What the step spent, as the project accounts for it (`training/compute.py`): a control is compared with a
# student only at equal optimizer steps, prompts and completions (notebook 03).

# %%
grpo_compute(result.log_history, steps=1, prompts_per_step=GRPO.prompts_per_step, num_generations=GRPO.num_generations)
