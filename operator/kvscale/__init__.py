"""kvscale: capacity planning and SLO-driven autoscaling for LLM serving on Kubernetes."""

__version__ = "0.1.0"
