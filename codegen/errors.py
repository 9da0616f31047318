"""The error types kvforge raises for configs, and a formatter for pydantic's validation errors."""
from __future__ import annotations

from pydantic import ValidationError


class ConfigError(ValueError):
    """A config that cannot work; the message names the field, its value and what is allowed."""


def describe_validation_error(model: str, err: ValidationError, skip_tags: tuple[str, ...] = ()) -> str:
    """One line per problem: `Model.field=value: what is wrong and what is allowed`.

    `skip_tags` are tagged-union member names pydantic puts in front of the field path."""
    lines = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"] if p not in skip_tags)
        where = f"{model}.{loc}" if loc else model
        msg = e["msg"].removeprefix("Value error, ")
        if loc and "input" in e and not isinstance(e["input"], dict):
            lines.append(f"{where}={e['input']!r}: {msg}")
        elif msg.startswith(model):  # a model-level check that already names its field
            lines.append(msg)
        else:
            lines.append(f"{where}: {msg}")
    return "\n".join(lines)


def build(model_cls, data: dict):
    """Construct `model_cls` from plain data; a rejection becomes one ConfigError."""
    try:
        return model_cls.model_validate(data)
    except ValidationError as err:
        raise ConfigError(describe_validation_error(model_cls.__name__, err)) from None
    except ValueError as err:  # raised before pydantic runs (e.g. DecodeConfig's backend dispatch)
        raise ConfigError(str(err)) from None
