"""Run configs that make every stage tiny (1 GRPO step, 8-token completions) for tests where the
model's skill does not matter. `tiny_config` holds config of every op of the code location; the grid and
`tests.lakes.materialize` pass on only the selected ones'."""

from pathlib import Path

from noisy_student_assets.core import layout
from noisy_student_assets.core.settings import TRL_ROLLOUTS, TWO_DIGIT_ADDITION
from noisy_student_assets.defs.checks import SMOKE_GENERATION

TINY_GRPO = {
    "max_steps": 1,
    "num_generations": 2,
    "prompts_per_step": 2,
    "max_completion_length": 8,
    "rollouts": TRL_ROLLOUTS,  # a vLLM engine's start would cost more than a tiny run's sampling
    "validation_every": 0,  # labeled RL's check generates through that engine (test_labeled_rl_validation.py)
}
# A random model runs every completion to its (8-token) limit, often in whitespace alone, and answers nothing:
# the degenerate-output checks would stop every run, so their thresholds are off here (tests/unit/test_guards.py and
# tests/integration/test_broken_models.py test them).
RANDOM_MODEL_OUTPUT = {
    "min_answer_rate": 0.0,
    "max_truncation_rate": 1.0,
    "max_identical_share": 1.0,
    "max_unevaluated_rate": 1.0,
}
TINY_EVAL = {"backend": "transformers", "max_new_tokens": 8, "samples": 2, "ks": [1, 2]} | RANDOM_MODEL_OUTPUT
TINY_SMOKE = {"prompts": 2, "max_new_tokens": 8, "max_empty_rate": 1.0, "max_truncation_rate": 1.0}
TINY_GREEDY_EVAL = TINY_EVAL | {"samples": 0, "ks": []}
TINY_SAMPLING = {"backend": "transformers", "k": 3, "max_new_tokens": 8, "shard_size": 2}
TINY_VERIFIER = {
    "backend": "transformers",
    "k": 4,
    "temperature": 1.0,
    "max_new_tokens": 8,
    "max_steps": 2,
    "pairs_per_step": 2,
    "max_length": 64,
    "score_batch_size": 4,
    # 3 validation problems cannot show a verifier informative at 95%: the bootstrap's median must be above chance
    "informative_confidence": 0.0,
}
N_LABELED, N_UNLABELED, N_VALIDATION = 4, 6, 3
TWO_DIGIT = {"kind": "reasoning_gym", "name": "basic_arithmetic", "task_options_json": TWO_DIGIT_ADDITION}

TASK_AND_MODEL = [layout.PROBLEM_POOL, layout.EVAL_PROBLEMS, layout.BASE_MODEL]
"""An arm's task (its pool and held-out set) and base model."""
FOUNDATION = [*TASK_AND_MODEL, layout.LABELED_PROBLEMS, layout.LABELED_RL]
"""What round 1 reads, evaluations aside."""


def op(*key_path: str) -> str:
    """The op name of an asset: `round_001__generations`."""
    return "__".join(key_path)


def round_names(number: int, *names: str) -> list[str]:
    return ["/".join(layout.round_asset(number, name)) for name in names]


K_CHANGED = round_names(
    1,
    layout.GENERATIONS,
    layout.PSEUDO_LABELS,
    layout.STUDENT,
    layout.control_checkpoint(layout.LABELED_ONLY),  # its completion cap comes from the teacher's samples
    layout.control_eval(layout.LABELED_ONLY),
    layout.EVAL_REPORT,
)
"""What a changed default K redoes in round 1 of an arm whose experiment lists the labeled-only control alone
(tests/experiments/grid.yaml): the samples and everything that reads them."""


def round_chain(number: int, *controls: str) -> list[str]:
    """A round's student chain and the given controls, with their evaluations; from round 2 on, opened by what its
    teacher's promotion reads (the validation evals of the previous round's student and teacher) and the teacher."""
    control_assets = [
        name for control in controls for name in (layout.control_checkpoint(control), layout.control_eval(control))
    ]
    promotion = []
    if number > 1:
        promotion = [layout.LABELED_RL_VALIDATION] if number == 2 else []
        promotion += [*round_names(number - 1, layout.STUDENT_VALIDATION), *round_names(number, layout.TEACHER)]
    return promotion + round_names(
        number, layout.GENERATIONS, layout.PSEUDO_LABELS, layout.STUDENT, *control_assets, layout.EVAL_REPORT
    )


def tiny_config(tiny_model_dir: Path, rounds: int = 2, tau: float = 0.0, min_coverage: float = 0.0) -> dict:
    """Run config of every op of the code location (with `rounds` rounds), tiny."""
    ops = {
        layout.PROBLEM_POOL: {"config": {"source": TWO_DIGIT | {"size": 40, "seed": 0}}},
        layout.EVAL_PROBLEMS: {"config": {"source": TWO_DIGIT | {"size": 5, "seed": 1000}}},
        "problem_split": {"config": {"n_labeled": N_LABELED, "n_unlabeled": N_UNLABELED, "n_validation": N_VALIDATION}},
        layout.BASE_MODEL: {"config": {"reference": str(tiny_model_dir)}},
        layout.LABELED_RL: {"config": {"grpo": TINY_GRPO}},
        layout.BASE_MODEL_EVAL: {"config": TINY_EVAL},
        layout.LABELED_RL_EVAL: {"config": TINY_EVAL},
        layout.LABELED_RL_VALIDATION: {"config": TINY_GREEDY_EVAL},
    }
    checkpoints = [layout.BASE_MODEL, layout.LABELED_RL]
    for number in range(1, rounds + 1):
        prefix = layout.round_prefix(number)
        ops |= {
            op(prefix, layout.GENERATIONS): {"config": TINY_SAMPLING},
            op(prefix, layout.VERIFIER): {"config": TINY_VERIFIER},
            op(prefix, layout.PSEUDO_LABELS): {
                "config": {"tau": tau, "min_coverage": min_coverage, "min_mean_agreement": 0.0}
            },
            op(prefix, layout.STUDENT): {"config": {"grpo": TINY_GRPO}},
            op(prefix, layout.STUDENT_VALIDATION): {"config": TINY_GREEDY_EVAL},
            op(prefix, layout.EVAL_REPORT): {"config": TINY_EVAL},
        }
        checkpoints.append(op(prefix, layout.STUDENT))
        for control in layout.CONTROLS:
            checkpoint = op(prefix, layout.control_checkpoint(control))
            ops[checkpoint] = {"config": {"grpo": TINY_GRPO}}
            ops[op(prefix, layout.control_eval(control))] = {"config": TINY_GREEDY_EVAL}
            checkpoints.append(checkpoint)
    ops |= {f"{checkpoint}_{SMOKE_GENERATION}": {"config": TINY_SMOKE} for checkpoint in checkpoints}
    return {"ops": ops}


def with_op_config(config: dict, op_name: str, **settings) -> dict:
    """A copy of `config` with `settings` written into one op's config."""
    ops = dict(config["ops"])
    ops[op_name] = {"config": ops[op_name]["config"] | settings}
    return {"ops": ops}
