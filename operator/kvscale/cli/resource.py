"""Reading an LLMDeployment file the way the offline commands need it: spec plus any config.json."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvscale.api.spec import LLMDeployment, load_resource
from kvscale.catalog import read_config_json


def load_resource_with_config(path: Path) -> tuple[LLMDeployment, dict[str, Any] | None]:
    """The resource and, when `spec.model.configPath` is set, its config.json (relative to the file)."""
    resource = load_resource(path)
    if not resource.spec.model.config_path:
        return resource, None
    config_path = Path(resource.spec.model.config_path)
    if not config_path.is_absolute():
        config_path = path.parent / config_path
    return resource, read_config_json(config_path)
