"""Dagster config and resource classes derived from the core's settings (`core/settings.py`): the same fields,
types, per-profile defaults and help, so that no setting is declared twice."""

from __future__ import annotations

from typing import Any, Union, get_args, get_origin

import dagster as dg
from pydantic import BaseModel, Field, create_model


def derived_class(settings: type[BaseModel], name: str, base: type[BaseModel]) -> type:
    """A subclass of `base` (a `dg.Config` or `dg.ConfigurableResource`) with the fields of `settings`; nested
    settings become nested `dg.Config` blocks, their defaults carried over."""
    fields: dict[str, Any] = {}
    for field_name, info in settings.model_fields.items():
        annotation = info.annotation
        nested = [
            arg
            for arg in (get_args(annotation) or (annotation,))
            if isinstance(arg, type) and issubclass(arg, BaseModel)
        ]
        if not nested:
            fields[field_name] = (annotation, info)
            continue
        block = derived_class(nested[0], f"{nested[0].__name__.removesuffix('Settings')}Config", dg.Config)
        optional = get_origin(annotation) is Union or type(None) in get_args(annotation)
        default = None if info.default is None else block(**info.default.model_dump())
        fields[field_name] = (block | None if optional else block, Field(default=default, description=info.description))
    return create_model(name, __base__=base, __doc__=settings.__doc__, **fields)
