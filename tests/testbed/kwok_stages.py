"""Assemble the bed's kwok stages from the upstream ones (stdin: kwok's YAML documents; stdout: the bed's).

Upstream's fast pod-ready stage makes every pod Running and Ready at once. The bed adds a slow start-up for
the pods that ask for one, the way a model server takes minutes to load its weights: a pod whose first
container has the environment variable KVSCALE_BED_STARTUP_DELAY (a Go duration, e.g. "60s") stays Pending
that long and then becomes Running and Ready (stage pod-ready-slow); every other pod keeps the fast stage.
Set it through the LLMDeployment's spec.serving.env. Python's standard library only (no YAML parser): the
edit is textual, and checked.
"""

from __future__ import annotations

import sys

DELAY_ENV = "KVSCALE_BED_STARTUP_DELAY"
_DELAY_VALUE = f'.spec.containers.[0].env.[] | select( .name == "{DELAY_ENV}" ) | .value'
_SELECTOR_END = """      operator: 'NotIn'
      values:
      - 'True'
"""


def bed_stages(upstream: str) -> str:
    documents = upstream.split("\n---\n")
    ready = [d for d in documents if "\n  name: pod-ready\n" in d]
    if len(ready) != 1 or _SELECTOR_END not in ready[0] or "\n  next:\n" not in ready[0]:
        raise SystemExit("kwok's pod-ready stage changed shape; update tests/testbed/kwok_stages.py")
    fast = ready[0].replace(_SELECTOR_END, _SELECTOR_END + f"""    - key: '{_DELAY_VALUE}'
      operator: 'DoesNotExist'
""")
    slow = ready[0].replace("\n  name: pod-ready\n", "\n  name: pod-ready-slow\n").replace(
        _SELECTOR_END, _SELECTOR_END + f"""    - key: '{_DELAY_VALUE}'
      operator: 'Exists'
""").replace("\n  next:\n", f"""
  delay:
    durationMilliseconds: 0
    durationFrom:
      expressionFrom: '{_DELAY_VALUE}'
  next:
""", 1)
    return "\n---\n".join([fast if d is ready[0] else d for d in documents] + [slow])


if __name__ == "__main__":
    sys.stdout.write(bed_stages(sys.stdin.read()))
