"""The configuration reference (`docs/configuration.md`), generated from the code: every op's settings with their
defaults under both profiles and their help, the arm fields and what they set, the student modes, the label sources,
the resources.

    python -m noisy_student_assets.defs.reference > docs/configuration.md     # `make docs`

A test fails when the committed page differs from what this prints. The profile is read when the settings load, so
each profile's defaults are read in a process of its own (`--defaults`).
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import subprocess
import sys

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from noisy_student_assets.core.profiles import PROFILE_ENV_VAR, PROFILES

OUTPUT = "docs/configuration.md"
REQUIRED = "(required)"
MACHINE_PATHS = ("root", "lock_dir", "directory")
"""Resource fields whose default is a path of the machine that loads the code: not written into the page."""


def _config_classes() -> dict[str, type[BaseModel]]:
    """Each configurable op of the code location (asset or check) -> its config class."""
    from noisy_student_assets.defs.code_location import defs

    found = {}
    for name, node in defs.resolve_implicit_global_asset_job_def().graph.node_dict.items():
        annotation = inspect.signature(node.definition.compute_fn.decorated_fn).parameters.get("config")
        if annotation is not None:
            found[name] = annotation.annotation
    return found


def _resources() -> dict[str, BaseModel]:
    from noisy_student_assets.defs.code_location import defs

    return {name: resource for name, resource in defs.resources.items() if isinstance(resource, BaseModel)}


def _fields(model: BaseModel | type[BaseModel], prefix: str = "") -> dict[str, tuple[object, str]]:
    """Dotted field path -> (default, help) of a config or resource instance (or of a class: its declared defaults),
    nested blocks flattened; a nested block that defaults to null (a problem source) is one entry."""
    declared = model if isinstance(model, type) else type(model)
    rows = {}
    for name, info in declared.model_fields.items():
        value = info.default if isinstance(model, type) else getattr(model, name)
        if isinstance(value, BaseModel):
            rows |= _fields(value, f"{prefix}{name}.")
        else:
            rows[prefix + name] = (REQUIRED if value is PydanticUndefined else value, info.description or "")
    return rows


def _defaults() -> dict:
    """Every setting's default and help under the active profile, as JSON-ready data."""
    from noisy_student_assets.core.settings import ProblemSource

    ops = {name: {"class": config.__name__, "fields": _fields(config())} for name, config in _config_classes().items()}
    resources = {
        name: {"class": type(resource).__name__, "fields": _fields(resource)} for name, resource in _resources().items()
    }
    return {"ops": ops, "resources": resources, "source": _fields(ProblemSource)}


def _profile_defaults(profile: str) -> dict:
    """`profile`'s defaults over the shipped experiment files, whatever experiments the caller points at: the
    page documents the ops the shipped code location defines."""
    from noisy_student_assets.core import environment
    from noisy_student_assets.core.experiments.directory import SHIPPED_EXPERIMENTS

    env = os.environ | {PROFILE_ENV_VAR: profile, environment.EXPERIMENTS: str(SHIPPED_EXPERIMENTS)}
    out = subprocess.run(
        [sys.executable, "-m", "noisy_student_assets.defs.reference", "--defaults"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout)


def _value(value: object) -> str:
    if value == REQUIRED:
        return value
    if isinstance(value, str):
        return f"`{value}`" if value else '`""`'
    return f"`{json.dumps(value)}`"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _op_groups(ops: dict) -> dict[str, list[str]]:
    """Config class -> the ops that take it, a round's ops written once as `round_00N__<asset>`."""
    from noisy_student_assets.core.layout import ROUND_PREFIX

    groups: dict[str, list[str]] = {}
    for name, op in sorted(ops.items()):
        shown = f"{ROUND_PREFIX}00N__{name.split('__', 1)[1]}" if name.startswith(ROUND_PREFIX) else name
        if shown.endswith("_smoke_generation"):
            shown = "<checkpoint op>_smoke_generation"
        if shown not in groups.setdefault(op["class"], []):
            groups[op["class"]].append(shown)
    return groups


def render() -> str:
    """The reference page."""
    from noisy_student_assets.core.pseudo_labels.sources.registry import SOURCES
    from noisy_student_assets.core.settings import SOURCE_KIND_FIELDS
    from noisy_student_assets.core.training.modes.registry import MODES

    by_profile = {profile: _profile_defaults(profile) for profile in PROFILES}
    cpu, gpu = by_profile["cpu"], by_profile["gpu"]
    lines = [
        "# Configuration reference",
        "",
        "Generated from `noisy_student_assets/core/settings.py` by `make docs`",
        "(`python -m noisy_student_assets.defs.reference`); a test fails when this page and the code differ. Each",
        "setting is declared once there, with its default under each profile (`NOISY_STUDENT_PROFILE=cpu|gpu`,",
        "`make ... PROFILE=gpu`). Set one in the launchpad or with",
        '`--config-json \'{"ops": {"<op>": {"config": {...}}}}\'` (the grid takes the same JSON); an arm field',
        "(below) wins over the run config for the settings it names.",
        "",
        "## Settings of each op",
        "",
    ]
    for config, ops in _op_groups(cpu["ops"]).items():
        example = next(name for name in sorted(cpu["ops"]) if cpu["ops"][name]["class"] == config)
        lines += [
            f"### {', '.join(f'`{op}`' for op in ops)}",
            "",
            "| setting | cpu | gpu | meaning |",
            "|---|---|---|---|",
        ]
        for path, (default, help_text) in cpu["ops"][example]["fields"].items():
            lines.append(
                f"| `{path}` | {_value(default)} | {_value(gpu['ops'][example]['fields'][path][0])} | "
                f"{_cell(help_text)} |"
            )
        lines.append("")
    lines += [
        "### `source` (of `problem_pool` and `eval_problems`)",
        "",
        "A source is given whole: `null` is the profile's, and a source you give replaces it (fields its `kind`",
        "does not read are rejected). Kinds and the fields each reads: "
        + "; ".join(f"`{kind}`: {', '.join(fields)}" for kind, fields in SOURCE_KIND_FIELDS.items())
        + ".",
        "",
        "| field | default | meaning |",
        "|---|---|---|",
    ]
    lines += [
        f"| `{path}` | {_value(default)} | {_cell(help_text)} |" for path, (default, help_text) in cpu["source"].items()
    ]
    lines += _arm_field_section()
    lines += [
        "",
        "## Student modes (`mode`)",
        "",
        "Registered in `core/training/modes/registry.py`.",
        "",
        "| mode | trains |",
        "|---|---|",
    ]
    lines += [f"| `{name}` | {_cell(mode.description)} |" for name, mode in MODES.items()]
    lines += [
        "",
        "## Label sources (`label_source`)",
        "",
        "Registered in `core/pseudo_labels/sources/registry.py`.",
        "",
    ]
    lines += ["| source | weighs each sample's vote by |", "|---|---|"]
    lines += [f"| `{name}` | {_cell(source.description)} |" for name, source in SOURCES.items()]
    return "\n".join(lines + _resource_sections(cpu["resources"], gpu["resources"])).rstrip() + "\n"


def _arm_field_section() -> list[str]:
    """The reference page's arm fields: the settings each sets."""
    from noisy_student_assets.core.experiments.arms import ARM_FIELDS

    lines = [
        "",
        "## Arm fields",
        "",
        "An experiment file's arms (`experiments/*.yaml`) set these; each overrides the settings named.",
        "",
        "| arm field | sets | meaning |",
        "|---|---|---|",
    ]
    for name, field in ARM_FIELDS.items():
        targets = ", ".join(f"`{stage}`: `{path}`" for stage, path, *_ in field.targets)
        lines.append(f"| `{name}` | {targets} | {_cell(field.help or field.setting().description or '')} |")
    return lines


def _resource_sections(cpu: dict, gpu: dict) -> list[str]:
    """The reference page's resources: each one's fields with their cpu and gpu defaults."""
    lines = ["", "## Resources", ""]
    for name, resource in cpu.items():
        # The lake and the compute nest into other resources (IO managers, stage_resources): each is documented once.
        fields = {
            path: row
            for path, row in resource["fields"].items()
            if path.split(".")[0] not in ("lake", "compute") and ".lake." not in path
        }
        if not fields:
            continue
        lines += [f"### `{name}` ({resource['class']})", "", "| field | cpu | gpu | meaning |", "|---|---|---|---|"]
        for path, (default, help_text) in fields.items():
            if path.rsplit(".", 1)[-1] in MACHINE_PATHS:
                cpu_shown = gpu_shown = "(a path on this machine)"
            else:
                cpu_shown, gpu_shown = _value(default), _value(gpu[name]["fields"][path][0])
            lines.append(f"| `{path}` | {cpu_shown} | {gpu_shown} | {_cell(help_text)} |")
        lines.append("")
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--defaults", action="store_true", help="print the active profile's defaults as JSON")
    args = parser.parse_args(argv)
    print(json.dumps(_defaults(), default=str) if args.defaults else render(), end="" if not args.defaults else "\n")


if __name__ == "__main__":
    main()
