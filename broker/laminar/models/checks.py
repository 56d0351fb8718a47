"""What a model is (`JsonModel`), and the checks of decoded JSON values its `from_json` makes:
each returns the value with its type, or raises `ModelError` saying which field is wrong and
how.

A field absent from its object is an error to the plain checks, and None to the `optional_`
ones (as JSON null is)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, Self, TypeGuard


class ModelError(ValueError):
    """A JSON value that is not what its model says (the API answers it 400 `bad_request`)."""


class TooLargeError(ModelError):
    """A JSON body over one of the contract's count limits (the API answers it 413)."""


class JsonModel(Protocol):
    """What every model is: made from its JSON (`from_json`) and back (`to_json`)."""

    def to_json(self) -> dict[str, Any]: ...

    @classmethod
    def from_json(cls, obj: Any) -> Self: ...


JsonObject = Mapping[str, Any]


def json_object(value: object, message: str = "the body must be a JSON object") -> JsonObject:
    if not isinstance(value, Mapping):
        raise ModelError(message)
    return value


def only_fields(obj: JsonObject, allowed: frozenset[str]) -> None:
    """ModelError naming the fields of `obj` that are not `allowed`, if any."""
    unknown = set(obj) - allowed
    if unknown:
        raise ModelError(f"unknown fields {sorted(unknown)}")


def required(obj: JsonObject, name: str) -> Any:
    if name not in obj:
        raise ModelError(f"{name} is missing")
    return obj[name]


def is_int(value: object) -> TypeGuard[int]:
    """A JSON integer (a bool is not one, though Python's bool is an int)."""
    return isinstance(value, int) and not isinstance(value, bool)


def integer(obj: JsonObject, name: str) -> int:
    value = required(obj, name)
    if not is_int(value):
        raise ModelError(f"{name} must be an integer, not {_shown(value)}")
    return int(value)


def optional_integer(obj: JsonObject, name: str) -> int | None:
    value = obj.get(name)
    return None if value is None else integer(obj, name)


def string(obj: JsonObject, name: str) -> str:
    value = required(obj, name)
    if not isinstance(value, str):
        raise ModelError(f"{name} must be a string, not {_shown(value)}")
    return value


def optional_string(obj: JsonObject, name: str) -> str | None:
    value = obj.get(name)
    return None if value is None else string(obj, name)


def boolean(obj: JsonObject, name: str) -> bool:
    value = required(obj, name)
    if not isinstance(value, bool):
        raise ModelError(f"{name} must be true or false, not {_shown(value)}")
    return value


def array(obj: JsonObject, name: str) -> list[Any] | tuple[Any, ...]:
    value = required(obj, name)
    if not isinstance(value, list | tuple):
        raise ModelError(f"{name} must be an array, not {_shown(value)}")
    return value


def strings(obj: JsonObject, name: str) -> tuple[str, ...]:
    items = array(obj, name)
    if not all(isinstance(item, str) for item in items):
        raise ModelError(f"{name} must be an array of strings")
    return tuple(items)


def integers(obj: JsonObject, name: str) -> tuple[int, ...]:
    items = array(obj, name)
    if not all(is_int(item) for item in items):
        raise ModelError(f"{name} must be an array of integers")
    return tuple(items)


def objects(obj: JsonObject, name: str) -> list[JsonObject]:
    items = array(obj, name)
    return [json_object(item, f"the items of {name} must be objects") for item in items]


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
