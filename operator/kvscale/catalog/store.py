"""Lookups in the shipped catalogs: models by id/alias (case-insensitive), GPUs by name/alias."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kvscale.catalog.architecture import ModelArchitecture, architecture_from_hf_config
from kvscale.catalog.gpus import GpuEntry, GpuSpec
from kvscale.errors import CatalogError, ModelConfigError, UnknownGpuError, UnknownModelError


class ModelEntry(BaseModel):
    """One model in data/models.yaml: its id, aliases, source and the config.json fields verbatim."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str
    aliases: list[str] = Field(default_factory=list)
    source: str
    total_params_b: float | None = Field(default=None, description="Published total parameters, billions.")
    active_params_b: float | None = Field(default=None, description="Published active parameters (MoE).")
    config: dict[str, Any]


def _normalise(name: str) -> str:
    return name.strip().lower()


def _read_data(filename: str) -> Any:
    text = resources.files("kvscale.catalog").joinpath("data", filename).read_text(encoding="utf-8")
    return yaml.safe_load(text)


@dataclass(frozen=True)
class Catalog:
    models: Mapping[str, ModelEntry]  # by normalised id and alias
    gpus: Mapping[str, GpuEntry]  # by normalised name and alias

    def model_entries(self) -> list[ModelEntry]:
        return sorted({id(e): e for e in self.models.values()}.values(), key=lambda e: e.id)

    def gpu_entries(self) -> list[GpuEntry]:
        return sorted({id(e): e for e in self.gpus.values()}.values(), key=lambda e: e.name)


T = TypeVar("T")


def _index(entries: list[T], keys: Any) -> dict[str, T]:
    index: dict[str, T] = {}
    for entry in entries:
        for key in keys(entry):
            norm = _normalise(key)
            if norm in index and index[norm] is not entry:
                raise CatalogError(f"catalog key {key!r} names two entries")
            index[norm] = entry
    return index


@cache
def load_catalog() -> Catalog:
    try:
        model_entries = [ModelEntry.model_validate(m) for m in _read_data("models.yaml")["models"]]
        gpu_entries = [GpuEntry.model_validate(g) for g in _read_data("gpus.yaml")["gpus"]]
    except (ValidationError, KeyError, TypeError) as exc:
        raise CatalogError(f"shipped catalog is malformed: {exc}") from exc
    models = _index(model_entries, lambda e: [e.id, e.id.split("/")[-1], *e.aliases])
    gpus = _index(gpu_entries, lambda e: [e.name, *e.aliases])
    return Catalog(models=models, gpus=gpus)


def find_model_entry(name: str) -> ModelEntry:
    catalog = load_catalog()
    entry = catalog.models.get(_normalise(name)) or catalog.models.get(_normalise(name.split("/")[-1]))
    if entry is None:
        known = ", ".join(e.id for e in catalog.model_entries())
        raise UnknownModelError(
            f"model {name!r} is not in the catalog; give spec.model.architecture (its config.json) "
            f"or one of: {known}"
        )
    return entry


def resolve_architecture(name: str, config: Mapping[str, Any] | None = None) -> ModelArchitecture:
    """The architecture for `name`: from `config` (a config.json mapping) when given, else the catalog."""
    if config is not None:
        return architecture_from_hf_config(config, name=name, source="inline config.json")
    entry = find_model_entry(name)
    return architecture_from_hf_config(entry.config, name=entry.id, source=entry.source)


def read_config_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ModelConfigError(f"cannot read config.json at {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise ModelConfigError(f"{path} does not hold a JSON object")
    return data


def find_gpu(name: str, price_usd_per_hour: float | None = None) -> GpuSpec:
    catalog = load_catalog()
    entry = catalog.gpus.get(_normalise(name))
    if entry is None:
        known = ", ".join(e.name for e in catalog.gpu_entries())
        raise UnknownGpuError(f"GPU type {name!r} is not in the catalog; known types: {known}")
    if price_usd_per_hour is not None:
        entry = entry.model_copy(update={"usd_per_hour": price_usd_per_hour})
    return GpuSpec.from_entry(entry)
