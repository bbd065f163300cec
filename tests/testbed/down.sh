#!/usr/bin/env bash
# Stops the test bed started by up.sh: every process by its recorded PID (never by name), waits
# for each to exit, then removes the runtime state (pki, etcd and Prometheus data, kubeconfig).
# Logs stay in .testbed/logs for post-mortems. Safe to run when nothing is up.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
GRACE_S=${KVSCALE_BED_STOP_GRACE_S:-20}

# Clients first, the datastore last; anything else recorded (inference simulators) right after kwok.
ORDER=(kwok kube-scheduler kube-controller-manager)
if [ -d "$PIDS" ]; then
  for f in "$PIDS"/*.pid; do
    [ -e "$f" ] || continue
    n=$(basename "$f" .pid)
    case " kwok kube-scheduler kube-controller-manager kube-apiserver prometheus etcd " in
      *" $n "*) ;;
      *) ORDER+=("$n") ;;
    esac
  done
fi
ORDER+=(kube-apiserver prometheus etcd)

alive() { [ -n "$(readlink "/proc/$1/exe" 2>/dev/null)" ]; }   # false for gone or zombie

stopped=0
for n in "${ORDER[@]}"; do
  [ -e "$PIDS/$n.pid" ] || continue
  if pid=$(pid_of "$n"); then
    kill -TERM "$pid" 2>/dev/null || true
    deadline=$(($(date +%s) + GRACE_S))
    while alive "$pid" && [ "$(date +%s)" -lt "$deadline" ]; do sleep 0.1; done
    if alive "$pid"; then
      tb_log "$n (pid $pid) ignored SIGTERM for ${GRACE_S}s: SIGKILL"
      kill -KILL "$pid" 2>/dev/null || true
      deadline=$(($(date +%s) + 10))
      while alive "$pid" && [ "$(date +%s)" -lt "$deadline" ]; do sleep 0.1; done
      alive "$pid" && { tb_log "could not stop $n (pid $pid)"; exit 1; }
    fi
    stopped=$((stopped + 1))
  fi
  rm -f "$PIDS/$n.pid"
done

rm -rf "$PIDS" "$ST/pki" "$ST/etcd" "$ST/prometheus" "$ST/kubeconfig" "$ST/prometheus-url" \
  "$ST/env" "$ST/ports.env"
tb_log "test bed stopped ($stopped processes); logs kept in $LOGS"
