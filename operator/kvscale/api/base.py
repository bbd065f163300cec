"""Shared pydantic configuration: camelCase on the wire, snake_case in Python, unknown fields refused."""

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel


class ApiModel(BaseModel):
    """Base of every API object: frozen values, camelCase aliases, typos rejected by name."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
        use_enum_values=False,
    )
