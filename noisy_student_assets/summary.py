"""Print where the eval reports and the MLflow store are, with each checkpoint's headline metrics.

`python -m noisy_student_assets.summary` (run by `make run` after the rounds).
"""

import json
from pathlib import Path

from resources.data_lake import default_root
from resources.tracking import TRACKING_DB_NAME



def eval_reports(lake: Path) -> list[tuple[str, Path]]:
    """(checkpoint name, report dir) for every published evaluation, base model first, rounds in order."""
    named = [("base_model", lake / "base_model_eval"), ("labeled_rl", lake / "labeled_rl_eval")]
    rounds = sorted((lake / "eval_report").glob("round-*")) if (lake / "eval_report").is_dir() else []
    return [(name, path) for name, path in named + [(p.name, p) for p in rounds] if (path / "metrics.json").exists()]


def main() -> None:
    lake = Path(default_root())
    reports = eval_reports(lake)
    print(f"\nData lake: {lake}")
    if not reports:
        print("No eval reports yet.")
        return
    metrics = {name: json.loads((path / "metrics.json").read_text())["metrics"] for name, path in reports}
    # Headline metrics only: the deltas are in each report.
    shown = [m for m in next(iter(metrics.values())) if "/" not in m and m != "problems"]
    print(f"{'checkpoint':<12}" + "".join(f"{m:>14}" for m in shown))
    for name, values in metrics.items():
        print(f"{name:<12}" + "".join(f"{values.get(m, float('nan')):>14.3f}" for m in shown))
    print("\nEval reports:")
    for name, path in reports:
        print(f"  {name:<12} {path / 'report.md'}")
    print(f"\nMLflow store: sqlite:///{lake / TRACKING_DB_NAME}")
    print(f"  compare runs: mlflow ui --backend-store-uri sqlite:///{lake / TRACKING_DB_NAME}")


if __name__ == "__main__":
    main()
