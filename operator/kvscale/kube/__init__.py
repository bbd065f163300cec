"""Kubernetes objects: pure builders (here) and, later, the writers that apply them.

Only this package (the writers) may import the `kubernetes` client; the builders return plain dicts.
"""

from kvscale.kube.builders import (
    OWNER_LABEL,
    SPEC_HASH_ANNOTATION,
    Owner,
    build_deployment,
    build_service,
    compute_spec_hash,
    owner_reference,
    selector_labels,
    selector_string,
)
from kvscale.kube.engines import DEFAULT_IMAGES, SERVING_PORT, EngineLaunch

__all__ = [
    "DEFAULT_IMAGES",
    "OWNER_LABEL",
    "SERVING_PORT",
    "SPEC_HASH_ANNOTATION",
    "EngineLaunch",
    "Owner",
    "build_deployment",
    "build_service",
    "compute_spec_hash",
    "owner_reference",
    "selector_labels",
    "selector_string",
]
