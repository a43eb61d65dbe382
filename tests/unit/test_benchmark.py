"""The benchmark's measuring instruments (the benchmark itself is `make benchmark`)."""

from __future__ import annotations

import time

import pytest

from benchmarks.run import MemorySampler, cost_ratio, phase_metrics, step_seconds


def test_memory_sampler_sees_a_peak_inside_its_window_only() -> None:
    with MemorySampler(interval_s=0.01) as memory:
        time.sleep(0.1)
        before = time.time()
        ballast = bytearray(300 * 2**20)  # 300 MiB, touched so that it is resident
        ballast[::4096] = b"x" * len(ballast[::4096])
        time.sleep(0.1)
        after = time.time()
        del ballast
        freed = time.time()
        time.sleep(0.5)
    with_ballast = memory.peak_gib(before, after)
    assert with_ballast - memory.peak_gib(0, before - 0.01) > 0.25
    # From a moment after the release (on a busy machine this thread may wait a while between two lines).
    assert memory.peak_gib(freed + 0.2, time.time()) < with_ballast - 0.25
    assert memory.peak_gib(time.time() + 10, time.time() + 20) == 0  # no samples, no peak


def test_stage_peaks_take_each_stage_from_the_previous_end_to_its_own() -> None:
    memory = MemorySampler()
    memory.samples = [(0.5, 1 * 2**30), (1.5, 3 * 2**30), (2.5, 2 * 2**30), (3.5, 5 * 2**30)]
    peaks = memory.stage_peaks_gib(start=0.0, ends={"sampling": 1.0, "consensus": 3.0, "training": 4.0})
    assert peaks == {"sampling": 1.0, "consensus": 3.0, "training": 5.0}
    # the control trained before the student: its window is the student's, not an empty one after it
    swapped = memory.stage_peaks_gib(start=0.0, ends={"sampling": 1.0, "training": 4.0, "control training": 3.0})
    assert swapped == {"sampling": 1.0, "control training": 3.0, "training": 5.0}


def test_step_phases_are_found_whatever_the_trainer_class_is_called() -> None:
    names = [
        f"profiling/Time taken: GuardedMergedLoraGenerationGRPOTrainer.{m}"
        for m in ("transformers.generate", "_prepare_inputs", "compute_loss", "answer_reward", "_calculate_rewards")
    ]
    found = phase_metrics([*names, "loss", "step_time"])
    assert found["generation"].endswith("GuardedMergedLoraGenerationGRPOTrainer.transformers.generate")
    assert found["loss forward"].endswith(".compute_loss") and found["rewards"].endswith(".answer_reward")
    with pytest.raises(ValueError, match="compute_loss"):
        phase_metrics([n for n in names if not n.endswith("compute_loss")])
    # Sampled by a rollout function (`grpo.rollouts: vllm`): TRL times no generation of its own.
    assert "generation" not in phase_metrics([n for n in names if not n.endswith("transformers.generate")])


def test_a_phase_s_seconds_per_step_total_its_micro_batches_calls(tmp_path) -> None:
    """With 4 micro-batches a step, TRL times 4 calls of the loss forward and of `_prepare_inputs` (one of which
    samples): a phase's seconds per step are its calls' total over the steps, not one call's mean."""
    import mlflow

    from benchmarks.run import step_profile

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = mlflow.MlflowClient(uri)
    run_id = client.create_run(client.create_experiment("steps")).info.run_id
    timer = "profiling/Time taken: GuardedGRPOTrainer."
    for step in range(2):
        client.log_metric(run_id, "step_time", 20.0, step=step)
        for call, sampled in enumerate([8.0, 0.0, 0.0, 0.0]):
            client.log_metric(run_id, f"{timer}_prepare_inputs", sampled + 0.5, step=4 * step + call)
            client.log_metric(run_id, f"{timer}answer_reward", 0.5 if sampled else 0.0, step=4 * step + call)
            client.log_metric(run_id, f"{timer}compute_loss", 1.0, step=4 * step + call)

    phases = step_profile(uri, run_id)

    assert phases["step"] == 20.0 and phases["loss forward"] == 4.0
    assert phases["generation + rewards"] == 10.0 and phases["rewards"] == 0.5 and phases["generation"] == 9.5
    assert phases["backward + optimizer"] == 6.0


def test_a_step_lasts_from_its_start_to_its_success_less_its_wait_for_the_device_lock() -> None:
    events = [
        ("sampling", "STEP_START", 10.0, ""),
        ("sampling", "", 11.0, "waiting for the device lock /tmp/noisy-student-cpu.lock: another heavy step holds it"),
        ("sampling", "", 31.0, "acquired the device lock /tmp/noisy-student-cpu.lock"),
        ("sampling", "ASSET_MATERIALIZATION", 40.0, ""),
        ("sampling", "STEP_SUCCESS", 42.5, ""),
        ("training", "STEP_START", 43.0, ""),
        ("training", "", 43.5, "acquired the device lock /tmp/noisy-student-cpu.lock"),  # at once: nothing waited
        ("training", "STEP_SUCCESS", 60.0, ""),
        ("eval", "STEP_START", 61.0, ""),
        ("eval", "STEP_FAILURE", 70.0, ""),
        (None, "RUN_SUCCESS", 71.0, ""),
    ]
    assert step_seconds(events) == {"sampling": 12.5, "training": 17.0}


def test_the_cost_ratio_is_project_over_plain_from_either_timer() -> None:
    cost = cost_ratio(stage_seconds=105.0, step_seconds=120.0, plain_seconds=100.0)
    assert cost["stage_ratio"] == pytest.approx(1.05) and cost["step_ratio"] == pytest.approx(1.2)
    assert cost["stage_extra_seconds"] == pytest.approx(5.0) and cost["step_extra_seconds"] == pytest.approx(20.0)


def test_publishing_replaces_only_the_text_between_the_markers(tmp_path, monkeypatch) -> None:
    from benchmarks import publish

    results = tmp_path / "benchmarks" / "results"
    results.mkdir(parents=True)
    (results / "cpu.md").write_text("round table\n")
    (results / "grpo_memory.md").write_text("step table\n")
    monkeypatch.setattr(publish, "REPO", tmp_path)
    page = f"intro\n{publish.BEGIN}\nold figures\n{publish.END}\nlater\n"

    published = publish.publish(page, "cpu")

    assert published.startswith(f"intro\n{publish.BEGIN}\n")
    assert published.endswith(f"{publish.END}\nlater\n")
    assert "round table" in published and "step table" in published and "old figures" not in published
    assert publish.publish(published, "cpu") == published


def test_a_grpo_step_s_phases_sum_its_micro_batches_and_its_rest_is_the_step_less_them() -> None:
    """`grpo_memory.step_figures`: each timed call counts towards the step it ran in (4 loss forwards a step, one
    generation), the rest of a step is what the two timed phases leave, and the steady figures skip the first step."""
    from benchmarks.grpo_memory import PHASES, step_figures

    log = [
        {"step_time": 20.0, "completions/mean_length": 40.0, "loss_tokens/computed": 900.0, "step": 1},
        {"step_time": 10.0, "completions/mean_length": 20.0, "loss_tokens/computed": 500.0, "step": 2},
        {"step_time": 12.0, "completions/mean_length": 30.0, "loss_tokens/computed": 700.0, "step": 3},
    ]
    seconds = {
        "generation": [(0, 9.0), (1, 3.0), (2, 4.0)],
        "loss forward": [(step, 1.0) for step in range(3) for _ in range(4)],
    }
    for entry in log:
        entry |= {"loss_tokens/unshared": 1600.0, "loss_tokens/completions": 16 * entry["completions/mean_length"]}
    figures = step_figures(log, seconds, completions=16)
    assert figures["phase_seconds"] == {
        "generation": [9.0, 3.0, 4.0],
        "loss forward": [4.0] * 3,
        PHASES[2]: [7.0, 3.0, 4.0],
    }
    assert figures["steady_seconds_per_step"] == 11.0
    assert figures["steady_loss_tokens_per_step"]["loss_tokens/computed"] == 600.0
    assert figures["steady_generation_tokens_per_second"] == pytest.approx((20.0 + 30.0) * 16 / 7.0)


def test_the_sampling_gap_table_gives_each_step_s_cost_over_the_one_before() -> None:
    from benchmarks.sampling_gap import STEPS, markdown

    rows = [{"step": step, "seconds": 50.0 + 2 * index, "generated_tokens": 100} for index, step in enumerate(STEPS)]
    table = markdown(rows)
    assert len(table) == 2 + len(STEPS)
    assert table[2].endswith("| 50.0 | +0.0 | 1.000 | 100 |")
    assert table[-1].endswith(f"| 60.0 | +2.0 | {60 / 50:.3f} | 100 |")
