#!/usr/bin/env bash
# Builds (once) and caches the test bed's binaries under ~/.cache/kvscale/testbed.
# Re-running is cheap: every part is skipped when its versioned binary exists.
# The parts build in three lanes at once (below): one `go build` leaves a core idle for much of its
# time (module downloads, `go mod tidy`, links), so one after another the cold build used about 64%
# of 2 cores. Each part's output goes to $TB/logs/<part>.log, and its tail to stderr if it fails.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=versions.env
source "$HERE/versions.env"
CACHE=${KVSCALE_CACHE:-$HOME/.cache/kvscale}
TB=$CACHE/testbed
export GOTOOLCHAIN=local GOPATH=$CACHE/go GOMODCACHE=$CACHE/go/pkg/mod GOCACHE=$CACHE/go-build GOFLAGS=-buildvcs=false
mkdir -p "$TB"
exec 3>&2  # the console, for log lines from parts whose own output goes to their log file
log() { printf '[testbed-build %s] %s\n' "$(date +%H:%M:%S)" "$*" >&3; }
mkdir -p "$TB/logs"

K8S_BIN=$TB/k8s-$K8S_VERSION
build_kubernetes() {
  [ ! -x "$K8S_BIN/kubectl" ] || return 0
  log "building kube-apiserver, kube-controller-manager, kube-scheduler, kubectl $K8S_VERSION (cold: about 8 min on 2 cores, the other parts beside it)"
  SRC=$TB/src/k8s-$K8S_VERSION; mkdir -p "$SRC" "$K8S_BIN.tmp"
  sed -e "s/@STAGING@/$K8S_STAGING_VERSION/g" "$HERE/stub-k8s/go.mod.in" > "$SRC/go.mod"
  cp "$HERE/stub-k8s/tools.go" "$SRC/tools.go"
  CMDS="k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl"
  ( cd "$SRC" && go get "k8s.io/kubernetes@$K8S_VERSION" && go mod tidy )
  LD="-s -w"
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    LD="$LD -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$K8S_MINOR -X $p.gitTreeState=clean"
  done
  # shellcheck disable=SC2086
  ( cd "$SRC" && go build -mod=mod -trimpath -ldflags "$LD" -o "$K8S_BIN.tmp/" $CMDS )
  rm -rf "$K8S_BIN" && mv "$K8S_BIN.tmp" "$K8S_BIN"
}

ETCD_BIN=$TB/etcd-$ETCD_VERSION
build_etcd() {
  [ ! -x "$ETCD_BIN/etcd" ] || return 0
  log "building etcd $ETCD_VERSION"
  SRC=$TB/src/etcd-$ETCD_VERSION; mkdir -p "$SRC" "$ETCD_BIN"
  printf 'module kvscale.local/etcdbin\n\ngo 1.25.0\n' > "$SRC/go.mod"
  ( cd "$SRC" && go get "go.etcd.io/etcd/server/v3@$ETCD_VERSION" \
      && go build -mod=mod -trimpath -ldflags "-s -w" -o "$ETCD_BIN/etcd.tmp" go.etcd.io/etcd/server/v3 )
  mv "$ETCD_BIN/etcd.tmp" "$ETCD_BIN/etcd"
}

go_install() {  # name version package [ldflags]
  local dir=$TB/$1-$2
  if [ ! -x "$dir/$1" ]; then
    log "building $1 $2"
    GOBIN=$dir.tmp go install -trimpath -ldflags "-s -w ${4:-}" "$3@$2"
    rm -rf "$dir" && mv "$dir.tmp" "$dir"
  fi
}
build_kwok() { go_install kwok "$KWOK_VERSION" sigs.k8s.io/kwok/cmd/kwok; }
build_helm() {
  go_install helm "$HELM_VERSION" helm.sh/helm/v3/cmd/helm \
    "-X helm.sh/helm/v3/internal/version.version=$HELM_VERSION -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=$K8S_MINOR -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=$K8S_MINOR"
}
# Not `go install pkg@version`: that also loads the module's deprecation notice from the proxy's
# version list, which the proxy here refuses for this module (403 on @v/list). `go get` of the
# exact version in a stub module does not need the list. The source is then copied and patched:
# v0.10.2 reports vllm:time_to_first_token_seconds as its simulated prefill delay, without the time a
# request waited for a max-num-seqs slot, where vLLM v1 measures it from arrival; the patch (beside
# this script) reports it from arrival. Its name is part of the cache key, so a patched build replaces
# an unpatched one. The build also leaves out what the simulator's command compiles but the bed never
# runs (`trim_simulator`; "-trimmed" in the cache key), about 180 of its 1,170 packages.
SIM_PATCH=llm-d-inference-sim-ttft-from-arrival
SIM_DIR=$TB/llm-d-inference-sim-$INFERENCE_SIM_VERSION-${SIM_PATCH#llm-d-inference-sim-}-trimmed
trim_simulator() {  # source dir
  # Test helpers kept in non-test files, which the command imports with their packages: a tokenizer
  # test server in containers (testcontainers-go and Docker's client, ~90 packages) and gomega matchers.
  rm "$1/pkg/tokenizer/test_utils.go" "$1/pkg/common/test_utils.go" "$1/pkg/kv-cache/kv_test_helper.go"
  # The SQLite driver (modernc.org/sqlite: a C library translated to Go, the slowest packages to
  # compile) serves only the response datasets of --dataset-path/--dataset-url, which the bed never sets.
  grep -q '^[[:space:]]*_ "modernc.org/sqlite"$' "$1/pkg/dataset/dataset.go"
  sed -i '/^[[:space:]]*_ "modernc.org\/sqlite"$/d' "$1/pkg/dataset/dataset.go"
}
build_simulator() {
  [ ! -x "$SIM_DIR/llm-d-inference-sim" ] || return 0
  log "building llm-d-inference-sim $INFERENCE_SIM_VERSION with $SIM_PATCH.patch, trimmed"
  SRC=$TB/src/llm-d-inference-sim-$INFERENCE_SIM_VERSION; mkdir -p "$SRC" "$SIM_DIR.tmp"
  printf 'module kvscale.local/simbin\n\ngo 1.25.7\n' > "$SRC/go.mod"; rm -f "$SRC/go.sum"
  ( cd "$SRC" && go get "github.com/llm-d/llm-d-inference-sim@$INFERENCE_SIM_VERSION" )
  MOD=$(cd "$SRC" && go list -m -f '{{.Dir}}' github.com/llm-d/llm-d-inference-sim)
  rm -rf "$SRC/patched" && cp -r "$MOD" "$SRC/patched" && chmod -R u+w "$SRC/patched"
  patch -d "$SRC/patched" -p1 --quiet < "$HERE/$SIM_PATCH.patch"
  trim_simulator "$SRC/patched"
  ( cd "$SRC/patched" && CGO_ENABLED=0 go build -mod=mod -trimpath -ldflags "-s -w" \
      -o "$SIM_DIR.tmp/llm-d-inference-sim" ./cmd/llm-d-inference-sim )
  rm -rf "$SIM_DIR" && mv "$SIM_DIR.tmp" "$SIM_DIR"
}

# LeaderWorkerSet (multi-node replicas): built from the module's own go.mod (the proxy refuses the module's
# version list, so `go install ...@version` fails; an exact version downloads). The CRD travels with it.
LWS_DIR=$TB/lws-$LWS_VERSION
build_lws() {
  [ ! -x "$LWS_DIR/lws-controller" ] || return 0
  log "building the LeaderWorkerSet controller $LWS_VERSION"
  SRC=$TB/src/lws-$LWS_VERSION; rm -rf "$SRC" "$LWS_DIR.tmp"; mkdir -p "$LWS_DIR.tmp"
  MOD=$(go mod download -json "sigs.k8s.io/lws@$LWS_VERSION" | python3 -c 'import json,sys;print(json.load(sys.stdin)["Dir"])')
  cp -r "$MOD" "$SRC" && chmod -R u+w "$SRC"
  ( cd "$SRC" && CGO_ENABLED=0 go build -mod=mod -trimpath -ldflags "-s -w" -o "$LWS_DIR.tmp/lws-controller" ./cmd )
  cp "$SRC/config/crd/bases/leaderworkerset.x-k8s.io_leaderworkersets.yaml" "$LWS_DIR.tmp/lws-crd.yaml"
  cp "$SRC/config/webhook/manifests.yaml" "$LWS_DIR.tmp/lws-webhooks.yaml"
  rm -rf "$LWS_DIR" && mv "$LWS_DIR.tmp" "$LWS_DIR"
}

# kwok's stage definitions ship inside its module: assemble the ones the bed uses, plus a slow start-up
# for pods that ask for one (tests/testbed/kwok_stages.py). The file name says which assembly it is.
STAGES="$TB/kwok-$KWOK_VERSION/stages-slow-start.yaml"
assemble_kwok_stages() {
  [ ! -s "$STAGES" ] || return 0
  KD=$(go mod download -json "sigs.k8s.io/kwok@$KWOK_VERSION" | python3 -c 'import json,sys;print(json.load(sys.stdin)["Dir"])')
  for f in node/fast/node-initialize node/heartbeat-with-lease/node-heartbeat-with-lease \
           pod/fast/pod-ready pod/fast/pod-complete pod/fast/pod-delete; do
    echo '---'; cat "$KD/kustomize/stage/$f.yaml"
  done | python3 "$HERE/kwok_stages.py" > "$STAGES.tmp" && mv "$STAGES.tmp" "$STAGES"
}

install_prometheus() {
  command -v prometheus >/dev/null && return 0
  log "installing Debian's prometheus"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq && apt-get install -y -qq --no-install-recommends prometheus >/dev/null
}

# The lanes: the Kubernetes binaries (the longest part, about 10 minutes alone) at normal priority, the
# other parts in two lanes at nice 10, which fill the cores the Kubernetes build leaves idle and yield
# them back when it needs both. A lane is a subshell with errexit (set above), so a part's failing
# command stops its lane; `wait` then reports it.
lane() {  # niceness part...: runs the parts one after another, each with its output in logs/<part>.log
  local niceness=$1 part started; shift
  [ "$niceness" -eq 0 ] || renice -n "$niceness" -p "$BASHPID" >/dev/null
  for part in "$@"; do
    started=$(date +%s)
    # In the background and then waited for: a command run as an `if` condition would have errexit off.
    ( "$part" ) >"$TB/logs/$part.log" 2>&1 &
    if ! wait "$!"; then
      log "FAILED: $part; the end of $TB/logs/$part.log:"
      tail -n 40 "$TB/logs/$part.log" >&2
      return 1
    fi
    [ "$(($(date +%s) - started))" -lt 2 ] || log "$part done in $(($(date +%s) - started)) s"
  done
}
lane 0 build_kubernetes & kubernetes_lane=$!
lane 10 build_etcd build_kwok build_helm install_prometheus & tools_lane=$!
lane 10 build_simulator build_lws assemble_kwok_stages & simulator_lane=$!
failed=0
for pid in "$kubernetes_lane" "$tools_lane" "$simulator_lane"; do wait "$pid" || failed=1; done
[ "$failed" -eq 0 ] || { log "FAILED: the test bed's build (above)"; exit 1; }

# One folder of links so scripts and tests need a single PATH entry.
mkdir -p "$TB/bin"
for b in "$K8S_BIN"/* "$ETCD_BIN/etcd" "$TB/kwok-$KWOK_VERSION/kwok" "$TB/helm-$HELM_VERSION/helm" \
         "$SIM_DIR/llm-d-inference-sim" "$LWS_DIR/lws-controller" "$LWS_DIR/lws-crd.yaml" "$LWS_DIR/lws-webhooks.yaml"; do
  ln -sfn "$b" "$TB/bin/$(basename "$b")"
done
ln -sfn "$STAGES" "$TB/bin/kwok-stages.yaml"
log "ready: $TB/bin"
