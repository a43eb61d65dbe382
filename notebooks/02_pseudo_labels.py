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
# # A round's pseudo-labels
#
# The teacher sampled K answers to every unlabeled problem; a vote over them, each sample weighed by a **label
# source** (the plain majority, the teacher's confidence, or a verifier's score), picks the pseudo-label, whose
# **agreement** (its share of the weight) must reach **tau** for the problem to be kept for the student. Whether a
# round can help is decided here first: the student learns what the kept labels say, right or wrong.
#
# The gold answers of the unlabeled problems are hidden from the vote and from training; the **audit** compares
# the labels with them afterwards, and that is the only place they appear below. Everything is read from the lake
# and recomputed with the round's own vote (`core/reporting/inspection.py`), so it is what the round computed.

# %% tags=["parameters"]
from noisy_student_assets.core import environment, layout
from noisy_student_assets.core.lake_reader import lake_rounds

LAKE = layout.default_lake_root()  # NOISY_STUDENT_DATA_LAKE, which `make setup` writes to .env
ARM = environment.inspected_arm(layout.DEFAULT_ARM)  # NOISY_STUDENT_ARM; `default` is the arm `make run` makes
ROUND = lake_rounds(LAKE).filter(arm=ARM)["round"].max()  # the arm's latest round with pseudo-labels
PROBLEM_IDS: list[str] = []  # unlabeled problems to look at; empty: one of each kind picked below

# %%
import polars as pl
from IPython.display import Image, Markdown, display

from noisy_student_assets.core.lake_reader import RoundLake
from noisy_student_assets.core.pseudo_labels.frontier import ORACLE
from noisy_student_assets.core.reporting import plots
from noisy_student_assets.core.reporting.inspection import (
    problem_record,
    sample_votes,
    source_labels,
    vote_summary,
)

pl.Config.set_fmt_str_lengths(100)
pl.Config.set_tbl_rows(40)
round_lake = RoundLake(LAKE, ARM, ROUND)
labels = round_lake.labels()
pseudo_labels, settings, audited = labels.table(), labels.settings, labels.audit
display(
    Markdown(
        f"Arm `{ARM}`, round {ROUND}: label source `{settings.label_source}`, tau {settings.tau:g}, "
        f"{pseudo_labels.height} unlabeled problems."
    )
)
pl.DataFrame([{"audit": name, "value": str(value)} for name, value in audited.model_dump().items()])

# %% [markdown]
# The audit's figures: **coverage** (the share of problems kept), **kept_label_accuracy** (the share of kept labels
# equal to the hidden gold), the teacher's **pass@1** (the share of all samples that are right), **maj@K** (the
# share of problems whose vote is right, kept or not) and **pass@K** (the share with at least one right sample: the
# ceiling of any vote over these samples).
#
# ## Agreement
#
# How strongly the teacher's samples agreed with the label, per problem; the problems right of tau were kept.

# %%
display(
    Image(plots.agreement_histogram(pseudo_labels["agreement"].to_list(), audited.tau, int(pseudo_labels["k"].max())))
)

# %% [markdown]
# Is agreement a good confidence? The label accuracy (against the hidden gold) of each agreement bucket:

# %%
display(Image(plots.label_accuracy_vs_agreement(labels.buckets)))
labels.buckets

# %% [markdown]
# ## The label-quality frontier, per label source
#
# Each source ranks the problems by its own confidence; keeping its most confident problems first traces its
# kept-label accuracy against coverage. The dashed **oracle** keeps first the problems where some sample is right
# (pass@K): no vote over these samples can lie above it. The dot is each source's operating point at tau: a source
# is better than another where its line is higher at the same coverage.

# %% tags=["main_figure"]
display(Image(plots.label_frontier(labels.frontier, labels.sources, ORACLE)))
labels.sources

# %% [markdown]
# ## A few problems, sample by sample
#
# Each sample's answer and the weight each label source gives it (`weight/<source>`); `matches hidden gold` is the
# audit's judgement, which no vote saw. Per problem: the label each source picks (`chosen` marks the arm's own
# source, whose labels trained the student), then the vote per distinct answer with each source's share of the
# weight, then the samples. Unless `PROBLEM_IDS` says otherwise, one problem of each kind is shown: a label kept
# but wrong (the student is trained towards a wrong answer), a problem on which the sources disagree, a problem
# dropped below tau although a sample was right, and a label kept and right.

# %%
votes = sample_votes(round_lake)
labels = source_labels(round_lake)
chosen = labels.filter("chosen")
disagreed = (
    labels.group_by("problem_id").agg(pl.col("pseudo_label").n_unique() > 1).filter("pseudo_label")["problem_id"]
)
solved = votes.filter("correct")["problem_id"]
kinds = {
    "kept, but wrong": chosen.filter(pl.col("kept") & ~pl.col("label_correct")).sort("agreement", descending=True),
    "the label sources disagree": chosen.filter(pl.col("problem_id").is_in(disagreed)),
    "dropped below tau, though a sample was right": chosen.filter(~pl.col("kept") & pl.col("problem_id").is_in(solved)),
    "kept and right": chosen.filter(pl.col("kept") & pl.col("label_correct")),
}
shown = {f"problem {problem_id}": problem_id for problem_id in PROBLEM_IDS} or {
    kind: problems["problem_id"][0] for kind, problems in kinds.items() if problems.height
}
for kind, problem_id in shown.items():
    record = problem_record(round_lake, problem_id)
    display(
        Markdown(
            f"### {kind}: `{problem_id}`\n\n> {record['prompt']}\n\n"
            f"Hidden gold (the audit's; no vote saw it): **{record['hidden_gold']}**"
        )
    )
    display(labels.filter(pl.col("problem_id") == problem_id).drop("problem_id"))
    display(vote_summary(votes, problem_id).rename({"correct": "matches hidden gold"}))
    display(
        votes.filter(pl.col("problem_id") == problem_id).select(
            "sample_index",
            "answer",
            pl.col("correct").alias("matches hidden gold"),
            pl.col("^weight/.*$"),
            pl.col("completion").str.slice(0, 80),
        )
    )
