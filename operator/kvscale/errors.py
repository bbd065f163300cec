"""kvscale's own exception tree. Third-party errors are wrapped (`raise ... from exc`) at the edges."""


class KvscaleError(Exception):
    """Root of every error kvscale raises on purpose."""


class InvalidSpecError(KvscaleError):
    """A resource or input file is malformed; the message names the field and what is allowed."""


class CatalogError(KvscaleError):
    """A catalog entry or a config.json is missing, ambiguous or malformed."""


class UnknownModelError(CatalogError):
    """The model name matches no catalog entry and no architecture was given."""


class UnknownGpuError(CatalogError):
    """The GPU type matches no catalog entry."""


class ModelConfigError(CatalogError):
    """A Hugging Face config.json lacks a field the performance model needs."""


class PlanningError(KvscaleError):
    """The planner was given inputs it cannot reason about (not: no plan meets the SLOs)."""
