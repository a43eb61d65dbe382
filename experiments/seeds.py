"""The main job once per seed, and the results across seeds (`make seeds SEEDS="0 1 2"`).

Each seed runs the whole graph (problems, base model, labeled RL, the gold-label control, rounds
1..N, every eval) in its own data lake `data_lake/seeds/seed-<s>/` with its own Dagster instance
beside it (`.dagster/`; open it with `DAGSTER_HOME=data_lake/seeds/seed-<s>/.dagster dagster dev`),
so one seed's history never shadows another's. A seed sets the labeled/unlabeled split, the GRPO
runs, the teacher's samples and the eval samples. Every seed evaluates on the same `--eval-size`
problems of the profile's eval source, less the few its own training split contains (2-5 of 210 on
the cpu profile). Every other setting is the profile's default.

`python experiments/seeds.py --report-only` rebuilds the tables and the figure from the lakes:
`data_lake/seeds/results.md`, `results.json`, `accuracy_by_checkpoint.png`.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import polars as pl

SEEDS_DIR = "seeds"


def seed_config(seed: int, eval_size: int, greedy_only: bool = False) -> dict[str, dict]:
    """Run config per partition set: the foundation's and controls' ops, and a round's."""
    from noisy_student_assets.config import EvalProblemsConfig

    eval_source = EvalProblemsConfig().resolved_source.model_dump() | {"size": eval_size}
    grpo = {"grpo": {"seed": seed}}
    evaluation = {"config": {"seed": seed} | ({"samples": 0, "ks": []} if greedy_only else {})}
    return {
        "foundation": {
            "problem_split": {"config": {"seed": seed}},
            "eval_problems": {"config": {"source": eval_source}},
            "labeled_rl_checkpoint": {"config": grpo},
            "base_model_eval": evaluation,
            "labeled_rl_eval": evaluation,
            "gold_label_rl_checkpoint": {"config": grpo},
            "gold_label_rl_eval": evaluation,
        },
        "round": {
            "noisy_student_round": {"config": {"sampling": {"seed": seed}} | grpo},
            "eval_report": evaluation,
        },
    }


def run_seed(lake_dir: Path, seed: int, eval_size: int, rounds: int, greedy_only: bool) -> None:
    import dagster as dg

    from noisy_student_assets.definitions import ASSETS_AND_CHECKS
    from noisy_student_assets.partitions import round_key
    from resources import lake_resources
    from resources.data_lake import DataLake

    resources = lake_resources(DataLake(root=str(lake_dir)))
    config = seed_config(seed, eval_size, greedy_only)
    instance_dir = lake_dir / ".dagster"
    instance_dir.mkdir(parents=True, exist_ok=True)
    with dg.DagsterInstance.local_temp(tempdir=str(instance_dir)) as instance:
        steps = [(dg.AssetSelection.groups("problems", "models", "controls"), config["foundation"], None)]
        steps += [(dg.AssetSelection.groups("rounds"), config["round"], round_key(n)) for n in range(1, rounds + 1)]
        for selection, ops, partition in steps:
            print(f"seed {seed}: materializing {partition or 'problems, models, controls'}", flush=True)
            result = dg.materialize(
                ASSETS_AND_CHECKS, selection=selection, resources=resources, instance=instance,
                run_config={"ops": ops}, partition_key=partition,
            )
            if not result.success:
                raise SystemExit(f"seed {seed}: {partition or 'foundation'} failed; see {instance_dir}")


def collect(seeds_dir: Path) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Per seed and checkpoint: headline metrics; per seed and round: the pseudo-label audit and the
    share of the gold-label gain."""
    from noisy_student_assets.summary import accuracy_table, gold_gain_shares, label_audits, load_metrics

    accuracy, rounds = [], []
    for lake in sorted(seeds_dir.glob("seed-*")):
        seed = lake.name.removeprefix("seed-")
        metrics = load_metrics(lake)
        if not metrics:
            continue
        accuracy.append(accuracy_table(metrics, seed).with_columns(pl.lit(next(iter(metrics.values()))["problems"]).alias("problems")))
        audits = label_audits(lake).with_columns(pl.lit(seed).alias("seed"))
        shares = gold_gain_shares(metrics)
        if shares:
            audits = audits.with_columns(pl.col("round").replace_strict(shares, default=None, return_dtype=pl.Float64).alias("share_of_gold_gain"))
        rounds.append(audits)
    return (pl.concat(accuracy) if accuracy else pl.DataFrame(), pl.concat(rounds, how="diagonal") if rounds else pl.DataFrame())


def mean_sd(frame: pl.DataFrame, by: str, columns: list[str]) -> pl.DataFrame:
    """`columns` as "mean ± sd (n)" per value of `by`, keeping `by`'s order of first appearance."""
    return frame.group_by(by, maintain_order=True).agg(
        [
            pl.format(
                "{} ± {} (n={})",
                pl.col(c).mean().round(3),
                pl.col(c).std().fill_null(0.0).round(3),
                pl.col(c).is_not_null().sum(),
            ).alias(c)
            for c in columns
        ]
    )


def report(seeds_dir: Path) -> str:
    from noisy_student_assets import plots
    from noisy_student_assets.markdown import markdown_table
    accuracy, rounds = collect(seeds_dir)
    if accuracy.is_empty():
        raise SystemExit(f"no evaluated seeds under {seeds_dir}")
    headline = [c for c in accuracy.columns if c not in ("checkpoint", "seed", "problems")]
    lines = [
        f"Seeds: {', '.join(accuracy['seed'].unique(maintain_order=True))}; "
        f"held-out problems: {', '.join(str(int(n)) for n in accuracy['problems'].unique(maintain_order=True))}.",
        "",
        "### Accuracy per checkpoint (mean ± sd over seeds)",
        "",
        markdown_table(mean_sd(accuracy, "checkpoint", headline)),
    ]
    if not rounds.is_empty():
        columns = [c for c in ("coverage", "kept_label_accuracy", "all_label_accuracy", "teacher_pass_at_1", "share_of_gold_gain") if c in rounds.columns]
        lines += ["", "### Pseudo-labels and the gold-label gain recovered, per round", "", markdown_table(mean_sd(rounds, "round", columns))]
        lines += ["", "### Per seed", "", markdown_table(accuracy.select("seed", "checkpoint", *headline), max_rows=None)]
    (seeds_dir / "accuracy_by_checkpoint.png").write_bytes(plots.accuracy_by_checkpoint(accuracy))
    (seeds_dir / "results.json").write_text(json.dumps({"accuracy": accuracy.to_dicts(), "rounds": rounds.to_dicts()}, indent=2))
    text = "\n".join(lines) + "\n"
    (seeds_dir / "results.md").write_text(text)
    return text


def main() -> None:
    from resources.data_lake import default_root

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--eval-size", type=int, default=210, help="held-out problems to generate (overlap with training is dropped)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--greedy-only", action="store_true",
        help="evaluate greedy accuracy only, without the profile's sampled maj@k/pass@k (a third of the eval's generation on cpu)",
    )
    parser.add_argument("--fresh", action="store_true", help="delete a seed's lake before running it")
    parser.add_argument("--report-only", action="store_true")
    args = parser.parse_args()
    seeds_dir = Path(default_root()) / SEEDS_DIR
    if not args.report_only:
        for seed in args.seeds:
            lake_dir = seeds_dir / f"seed-{seed}"
            if args.fresh:
                shutil.rmtree(lake_dir, ignore_errors=True)
            run_seed(lake_dir, seed, args.eval_size, args.rounds, args.greedy_only)
    print(report(seeds_dir))
    print(f"written: {seeds_dir / 'results.md'}, {seeds_dir / 'accuracy_by_checkpoint.png'}")


if __name__ == "__main__":  # vLLM spawns worker processes that re-import this module
    sys.exit(main())
