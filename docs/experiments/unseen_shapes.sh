#!/usr/bin/env bash
# Seven traffic shapes that are in no benchmark case and were never tuned on (docs/benchmarks.md, 2026-11-29):
# kvscale against static-peak on each, with the first-peak split, via decision_log.py (simulator seed 4).
# Run from the repository root: bash docs/experiments/unseen_shapes.sh [OUT_DIR]   (about 6 min on 2 cores)
set -euo pipefail
out=${1:-bench-out/unseen-shapes}  # bench-out/ is ignored by git
mkdir -p "$out"
C="input=1155:output=211:lengths=exponential:seed=21"  # the conversation trace's mean shape
K="input=2048:output=28:lengths=exponential:seed=21"   # the code trace's
run() {
  local name=$1
  shift
  .venv/bin/python docs/experiments/decision_log.py "$@" 4 --every 100000 --block 600 >"$out/$name.txt"
  echo "$name: $(head -1 "$out/$name.txt")"
}
# A step that stays: 3 -> 9 req/s after an hour; and 9 -> 3 (the resource states 5.53).
run conv-step-up autoscaling-conv.yaml "synthetic:bursts:rate=3:burst_rate=9:every=7200:length=3600:duration=7200:$C" 1.0
run conv-step-down autoscaling-conv.yaml "synthetic:bursts:rate=9:burst_rate=3:every=7200:length=3600:duration=7200:$C" 1.0
# A fast cycle: 1.7 to 9.4 req/s every 30 and every 25 minutes.
run conv-cycle-30min autoscaling-conv.yaml "synthetic:diurnal:rate=5.53:amplitude=0.7:period=1800:duration=7200:$C" 1.0
run conv-cycle-25min autoscaling-conv.yaml "synthetic:diurnal:rate=5.53:amplitude=0.7:period=1500:duration=7200:$C" 1.0
# The code shape: a step up, a step down (the resource states 2.57), and a two-hour ramp from 0.5 to 4.6 req/s.
run code-step-up autoscaling-code.yaml "synthetic:bursts:rate=1.5:burst_rate=4.5:every=7200:length=3600:duration=7200:$K" 1.0
run code-step-down autoscaling-code.yaml "synthetic:bursts:rate=4.5:burst_rate=1.5:every=7200:length=3600:duration=7200:$K" 1.0
run code-ramp autoscaling-code.yaml "synthetic:diurnal:rate=2.57:amplitude=0.8:period=14400:duration=7200:$K" 1.0
