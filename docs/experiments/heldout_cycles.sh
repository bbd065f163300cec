#!/usr/bin/env bash
# Cycles and surges held out from tuning PATTERN_MAX_PERIOD_S (docs/benchmarks.md, 2026-11-29): kvscale with the
# recurring-peak rule's longest period at 1,800 s (before) and 2,400 s (after), simulator seed 5, static-peak beside.
# Run from the repository root: bash docs/experiments/heldout_cycles.sh   (about 8 min on 2 cores)
set -euo pipefail
C="input=1155:output=211:lengths=exponential:seed=22"
K="input=2048:output=28:lengths=exponential:seed=22"
run() {
  local name=$1 resource=$2 trace=$3
  for period_s in 1800 2400; do
    echo "$name, period $period_s s: $(.venv/bin/python docs/experiments/decision_log.py "$resource" "$trace" 1.0 5 \
      --every 100000 --pattern-max-period-s "$period_s" | sed -n 1p)"
  done
}
run conv-cycle-35min autoscaling-conv.yaml "synthetic:diurnal:rate=5.53:amplitude=0.6:period=2100:duration=7200:$C"
run conv-surges-8min-every-25min autoscaling-conv.yaml "synthetic:bursts:rate=3:burst_rate=8:every=1500:length=480:duration=7200:$C"
run code-surges-6min-every-30min autoscaling-code.yaml "synthetic:bursts:rate=1.5:burst_rate=5:every=1800:length=360:duration=7200:$K"
run conv-cycle-60min autoscaling-conv.yaml "synthetic:diurnal:rate=5.53:amplitude=0.7:period=3600:duration=7200:$C"
run code-cycle-20min autoscaling-code.yaml "synthetic:diurnal:rate=2.57:amplitude=0.7:period=1200:duration=7200:$K"
