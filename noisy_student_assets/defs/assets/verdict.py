"""The verdict across arms: every round of every arm against its compute-matched controls, arms that differ
only by seed pooled (see `noisy_student_assets.core.reporting.summary`), with the comparison plot; shared by every
arm."""

from pathlib import Path

import dagster as dg
import polars as pl

from noisy_student_assets.core import layout
from noisy_student_assets.core.reporting import markdown
from noisy_student_assets.defs.assets.metadata import markdown_table, png_markdown
from noisy_student_assets.defs.assets.stages import stage
from noisy_student_assets.defs.partitions import ARMS, ASKED_FOR, ROUNDS, VERDICT_GROUP, round_key
from resources.stage_resources import StageResources

DIFFERENCE = "difference"
"""The metric an arm's own run holds per control, stepped by round: its group's difference from the control, with
its interval (`difference/labeled_only`, `.../low`, `.../high`)."""
VERDICT_NAME = "verdict"
"""`verdict.md` and `verdict.html` (see `markdown.write_report`)."""


@dg.asset(
    name=layout.VERDICT,
    group_name=VERDICT_GROUP,
    io_manager_key="directory_io_manager",
    deps=[
        dg.AssetKey(layout.BASE_MODEL_EVAL),
        dg.AssetKey(layout.LABELED_RL_EVAL),
        dg.AssetKey(layout.EVAL_PROBLEMS),  # with each arm's unlabeled problems: a test-time arm's transductive set
        dg.AssetKey(layout.UNLABELED_PROBLEMS),
        *(
            round_key(n, layout.eval_of(role))
            for n in range(1, ROUNDS + 1)
            for role in (layout.STUDENT_ROLE, *ASKED_FOR.controls)
        ),
        *(round_key(n, layout.PSEUDO_LABELS) for n in range(1, ROUNDS + 1)),  # their audits
    ],
    description="Every registered arm's rounds against their compute-matched controls: differences with paired "
    "bootstrap intervals (over problems, and over seeds for arms that differ only by seed), accuracy by round, the "
    "flips, and each arm's label-quality frontier of every source beside the oracle.",
)
def verdict(
    context: dg.AssetExecutionContext,
    stage_resources: StageResources,
) -> dg.Output[Path]:
    import mlflow

    from noisy_student_assets.core.pseudo_labels.frontier import ORACLE
    from noisy_student_assets.core.reporting import plots
    from noisy_student_assets.core.reporting.summary import break_even_figures, collect, summary_markdown
    from noisy_student_assets.core.reporting.test_time import ALL_EVAL

    arms = []
    for name in context.instance.get_dynamic_partitions(ARMS.name):
        try:
            arms.append(stage_resources.experiments.arm(name))
        except dg.Failure as missing:
            context.log.warning(f"left out: {missing.description}")
    with stage(context, None, stage_resources) as current:
        results = collect(stage_resources.lake.root_path, arms, ROUNDS)
        report = summary_markdown(results)
        grouped = results.accuracy.with_columns(pl.concat_str("experiment", "group", separator=": ").alias("group"))
        figure = plots.accuracy_by_round(grouped) if grouped.height else None
        staged = stage_resources.lake.staging_dir()
        results.accuracy.write_parquet(staged / "accuracy.parquet")
        results.differences.write_parquet(staged / "differences.parquet")
        figures = {"accuracy_by_round": figure} if figure else {}
        figures |= {
            f"label_frontier_{arm}_round_{number}": plots.label_frontier(
                curve, results.sources.filter((pl.col("arm") == arm) & (pl.col("round") == number)), ORACLE
            )
            for (arm, number), curve in results.frontiers.items()
        }
        figures |= break_even_figures(results)
        inline_report = markdown.write_report(staged, VERDICT_NAME, "Verdict", f"# Verdict\n\n{report}", figures)
        mlflow.log_artifacts(str(staged), artifact_path="verdict")
        arms_of = (
            {
                (experiment, group): arms
                for experiment, group, arms in results.accuracy.group_by("experiment", "group")
                .agg(pl.col("arm").unique())
                .iter_rows()
            }
            if results.differences.height
            else {}
        )
        for row in results.differences.iter_rows(named=True):
            eval_set = "" if row["eval_set"] == ALL_EVAL else f"/{row['eval_set']}"
            current.log_metrics(
                {f"{row['experiment']}/{row['group']}/round {row['round']}/{row['control']}{eval_set}": row["estimate"]}
            )
            # Beside each arm's accuracy by round, its group's difference with its interval (a band in the charts).
            difference = f"{DIFFERENCE}/{row['control']}{eval_set}"
            points = {difference: row["estimate"], f"{difference}/low": row["low"], f"{difference}/high": row["high"]}
            points = {name: value for name, value in points.items() if value is not None}
            for arm_name in arms_of.get((row["experiment"], row["group"]), []):
                current.resources.tracking.log_to_arm_run(arm_name, row["experiment"], points, row["round"])
    return current.output(
        staged,
        metadata={
            "verdict": dg.MetadataValue.md(
                "\n".join(f"- {s}" for s in [*results.sentences, *results.pending]) or "no round evaluated yet"
            ),
            "report": dg.MetadataValue.md(inline_report),
            "arms": len(arms),
            **({"accuracy_by_round": png_markdown("accuracy_by_round", figure)} if figure else {}),
            **(
                {"differences": markdown_table(results.differences, max_rows=None)}
                if results.differences.height
                else {}
            ),
        },
    )


defs = dg.Definitions(assets=[verdict])
