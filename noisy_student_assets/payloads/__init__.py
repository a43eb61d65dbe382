"""The heavy stages as programs of their own: `python -m noisy_student_assets.payloads <spec.json>` runs one
stage (sampling, training, evaluation) from a spec that names its inputs, settings and output places, and
reports logs, TRL's step metrics and its result through Dagster Pipes. The same stage functions run in the
Dagster process under the `inprocess` launcher. This layer imports the core and `dagster_pipes`, never Dagster."""
