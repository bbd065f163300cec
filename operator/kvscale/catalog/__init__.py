"""Shipped data about GPUs and model architectures, and loaders for user-supplied config.json files."""

from kvscale.catalog.architecture import ModelArchitecture, architecture_from_hf_config
from kvscale.catalog.gpus import GpuEntry, GpuSpec
from kvscale.catalog.store import (
    Catalog,
    ModelEntry,
    find_gpu,
    find_model_entry,
    load_catalog,
    read_config_json,
    resolve_architecture,
)

__all__ = [
    "Catalog",
    "GpuEntry",
    "GpuSpec",
    "ModelArchitecture",
    "ModelEntry",
    "architecture_from_hf_config",
    "find_gpu",
    "find_model_entry",
    "load_catalog",
    "read_config_json",
    "resolve_architecture",
]
