"""Runs a script with the burst-rule toggles of 2026-11-26-burst-rules.diff set: JUMPS=0|1 (rule 2), THR=0|1 (rule 3)."""
import sys, os, runpy
import kvscale.autoscaler.policy as P
P._HOLD_JUMPS = os.environ.get("JUMPS", "1") == "1"
P._BURST_BY_THROUGHPUT = os.environ.get("THR", "1") == "1"
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
