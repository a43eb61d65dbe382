"""Settings defaults changed as an edit of `core/settings.py` would change them, in the processes a test starts with
this directory on their PYTHONPATH (Python imports `sitecustomize` at start-up). `NOISY_STUDENT_TEST_DEFAULTS` holds
the changes, by settings class: '{"TeacherSamplingSettings": {"k": 6}}'; or `NOISY_STUDENT_TEST_DEFAULTS_FILE` names
a file that does, read by each process as it starts (a code server that *Reload definitions* starts again, too)."""

import json
import os
from pathlib import Path

_FILE = os.environ.get("NOISY_STUDENT_TEST_DEFAULTS_FILE")
CHANGES = json.loads(
    (Path(_FILE).read_text() if _FILE and Path(_FILE).is_file() else None)
    or os.environ.get("NOISY_STUDENT_TEST_DEFAULTS")
    or "{}"
)

if CHANGES:
    from noisy_student_assets.core import settings

    for class_name, fields in CHANGES.items():
        model = getattr(settings, class_name)
        for field, value in fields.items():
            model.model_fields[field].default = value
        model.model_rebuild(force=True)
