"""Runs a script with the burst-rule toggles of 2026-11-26-burst-rules.diff set: JUMPS=0|1 (rule 2), THR=0|1 (rule 3).

Only after `git apply docs/experiments/2026-11-26-burst-rules.diff` (the toggles are that patch's).
"""

import os
import runpy
import sys

import kvscale.autoscaler.policy as policy

policy._HOLD_JUMPS = os.environ.get("JUMPS", "1") == "1"  # type: ignore[attr-defined]
policy._BURST_BY_THROUGHPUT = os.environ.get("THR", "1") == "1"  # type: ignore[attr-defined]
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
