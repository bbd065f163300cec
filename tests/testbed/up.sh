#!/usr/bin/env bash
# Starts the local test bed on loopback: etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler, kwok (fake GPU nodes) and Prometheus. Every port is picked free at start and
# recorded in .testbed/ports.env. Idempotent: a healthy bed is left alone.
# Binaries come from tests/testbed/build.sh (cached under ~/.cache/kvscale/testbed).
# Stop it with tests/testbed/down.sh.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
WAIT_S=${KVSCALE_BED_WAIT_S:-180}   # deadline for each readiness condition (2 busy cores are slow)
KUBECONFIG_FILE=$ST/kubeconfig
PKI=$ST/pki

usage() {
  cat <<EOF
To use it from a shell:
  source $ST/env
or:
  export KUBECONFIG=$KUBECONFIG_FILE
  export PATH=$BIN:\$PATH
Prometheus: $(cat "$ST/prometheus-url")   (scrape targets: drop JSON files into $ST/prometheus/targets/)
Logs: $LOGS/   Stop: make testbed-down (tests/testbed/down.sh)
EOF
}

healthy() {
  local c
  for c in etcd kube-apiserver kube-controller-manager kube-scheduler kwok lws-controller prometheus; do
    pid_of "$c" >/dev/null || return 1
  done
  [ -s "$KUBECONFIG_FILE" ] && [ -s "$ST/prometheus-url" ] || return 1
  "$BIN/kubectl" --kubeconfig="$KUBECONFIG_FILE" get --raw /readyz --request-timeout=5s >/dev/null 2>&1 \
    || return 1
  curl -sf --max-time 5 "$(cat "$ST/prometheus-url")/-/ready" >/dev/null || return 1
}

if healthy; then
  tb_log "a healthy test bed is already up; nothing to do"
  usage
  exit 0
fi
if compgen -G "$PIDS/*.pid" >/dev/null; then
  tb_log "found a stale or partial bed: stopping it first"
  bash "$TESTBED_DIR/down.sh"
fi

for b in etcd kube-apiserver kube-controller-manager kube-scheduler kubectl kwok kwok-stages.yaml \
         lws-controller lws-crd.yaml lws-webhooks.yaml; do
  [ -e "$BIN/$b" ] || { tb_log "missing $BIN/$b: run 'make testbed-build' (tests/testbed/build.sh)"; exit 1; }
done
PROMETHEUS=$(command -v prometheus || true)
[ -n "$PROMETHEUS" ] || { tb_log "no prometheus binary: run 'make testbed-build'"; exit 1; }
KUBECTL=("$BIN/kubectl" --kubeconfig="$KUBECONFIG_FILE")

T0=$(date +%s)
STARTED=0
on_exit() {
  local rc=$?
  if [ "$rc" -ne 0 ] && [ "$STARTED" = 1 ]; then
    tb_log "the test bed FAILED to start (exit $rc); log tails follow, then it is stopped"
    tail_logs 40
    bash "$TESTBED_DIR/down.sh" || true
  fi
}
trap on_exit EXIT

rm -rf "$ST/etcd" "$ST/prometheus" "$PKI" "$PIDS"
mkdir -p "$PIDS" "$LOGS" "$PKI" "$ST/prometheus/targets" "$ST/prometheus/data"
if compgen -G "$LOGS/*.log" >/dev/null; then  # keep the previous run's logs for one more run
  rm -rf "$LOGS/previous" && mkdir -p "$LOGS/previous" && mv "$LOGS"/*.log "$LOGS/previous/"
fi

# --- free loopback ports, all held at once so they are distinct ---
read -r P_ETCD P_ETCD_PEER P_API P_PROM P_LWS_WEBHOOK P_LWS_HEALTH < <(python3 - <<'PY'
import socket
socks = []
for _ in range(6):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    socks.append(s)
print(*(s.getsockname()[1] for s in socks))
PY
)
cat > "$ST/ports.env" <<EOF
ETCD_PORT=$P_ETCD
ETCD_PEER_PORT=$P_ETCD_PEER
APISERVER_PORT=$P_API
PROMETHEUS_PORT=$P_PROM
LWS_WEBHOOK_PORT=$P_LWS_WEBHOOK
LWS_HEALTH_PORT=$P_LWS_HEALTH
EOF
tb_log "ports: etcd $P_ETCD (peer $P_ETCD_PEER), kube-apiserver $P_API, prometheus $P_PROM"

# start NAME BINARY ARGS...: runs detached (own session, so a Ctrl-C in the caller's terminal or
# make's process group does not reach it), output to logs/NAME.log, PID to pids/NAME.pid.
start() {
  local name=$1; shift
  setsid "$@" >"$LOGS/$name.log" 2>&1 </dev/null &
  echo $! >"$PIDS/$name.pid"
  STARTED=1
}

# wait_for NAME WHAT CMD...: polls CMD until it succeeds, failing early if NAME's process died (`running`),
# and failing after WAIT_S seconds.
wait_for() {
  local name=$1 what=$2; shift 2
  local deadline=$(($(date +%s) + WAIT_S))
  until "$@" >/dev/null 2>&1; do
    running "$name" || { tb_log "$name exited while waiting for: $what"; return 1; }
    [ "$(date +%s)" -lt "$deadline" ] || { tb_log "timed out after ${WAIT_S}s waiting for: $what"; return 1; }
    sleep 0.2
  done
  tb_log "ready: $what"
}

# --- PKI: CA, apiserver serving cert, service-account key pair, admin token (openssl) ---
(
  cd "$PKI"
  openssl req -x509 -newkey rsa:2048 -nodes -days 7 -subj "/CN=kvscale-testbed-ca" \
    -keyout ca.key -out ca.crt 2>/dev/null
  openssl req -newkey rsa:2048 -nodes -subj "/CN=kube-apiserver" \
    -keyout apiserver.key -out apiserver.csr 2>/dev/null
  printf '%s\n' \
    "subjectAltName=IP:127.0.0.1,IP:10.96.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local" \
    "extendedKeyUsage=serverAuth" "keyUsage=digitalSignature,keyEncipherment" > apiserver.ext
  openssl x509 -req -in apiserver.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 7 \
    -extfile apiserver.ext -out apiserver.crt 2>/dev/null
  # the LeaderWorkerSet webhooks, which the API server calls on loopback (tls.crt/tls.key: controller-runtime's names)
  mkdir -p lws
  openssl req -newkey rsa:2048 -nodes -subj "/CN=lws-webhook" -keyout lws/tls.key -out lws.csr 2>/dev/null
  printf '%s\n' "subjectAltName=IP:127.0.0.1,DNS:localhost" "extendedKeyUsage=serverAuth" \
    "keyUsage=digitalSignature,keyEncipherment" > lws.ext
  openssl x509 -req -in lws.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 7 \
    -extfile lws.ext -out lws/tls.crt 2>/dev/null
  openssl genrsa -out sa.key 2048 2>/dev/null
  openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
  TOKEN=$(openssl rand -hex 24)
  echo "$TOKEN,kvscale-admin,kvscale-admin,\"system:masters\"" > tokens.csv
  echo "$TOKEN" > admin.token
  chmod 600 ./*.key tokens.csv admin.token
)
API_URL=https://127.0.0.1:$P_API
rm -f "$KUBECONFIG_FILE"
"${KUBECTL[@]}" config set-cluster testbed --server="$API_URL" \
  --certificate-authority="$PKI/ca.crt" --embed-certs=true >/dev/null
"${KUBECTL[@]}" config set-credentials admin --token="$(cat "$PKI/admin.token")" >/dev/null
"${KUBECTL[@]}" config set-context testbed --cluster=testbed --user=admin --namespace=default >/dev/null
"${KUBECTL[@]}" config use-context testbed >/dev/null
chmod 600 "$KUBECONFIG_FILE"

# --- Prometheus (started early: it needs nothing else) ---
cat > "$ST/prometheus/prometheus.yml" <<EOF
# Written by tests/testbed/up.sh. Tests add scrape targets as JSON files in targets/.
global:
  scrape_interval: 2s
  scrape_timeout: 1s
  evaluation_interval: 2s
scrape_configs:
  - job_name: testbed
    file_sd_configs:
      - files: ["$ST/prometheus/targets/*.json"]
        refresh_interval: 1s
  - job_name: prometheus
    static_configs:
      - targets: ["127.0.0.1:$P_PROM"]
EOF
start prometheus "$PROMETHEUS" --config.file="$ST/prometheus/prometheus.yml" \
  --web.listen-address="127.0.0.1:$P_PROM" --web.enable-lifecycle \
  --storage.tsdb.path="$ST/prometheus/data" --storage.tsdb.retention.time=1d
echo "http://127.0.0.1:$P_PROM" > "$ST/prometheus-url"

# --- etcd ---
ETCD_URL=http://127.0.0.1:$P_ETCD
start etcd "$BIN/etcd" --name=testbed --data-dir="$ST/etcd" \
  --listen-client-urls="$ETCD_URL" --advertise-client-urls="$ETCD_URL" \
  --listen-peer-urls="http://127.0.0.1:$P_ETCD_PEER" \
  --initial-advertise-peer-urls="http://127.0.0.1:$P_ETCD_PEER" \
  --initial-cluster="testbed=http://127.0.0.1:$P_ETCD_PEER" \
  --unsafe-no-fsync --log-level=warn
etcd_ok() { curl -sf --max-time 2 "$ETCD_URL/health" | grep -q '"health":"true"'; }
wait_for etcd "etcd $ETCD_URL/health" etcd_ok

# --- kube-apiserver ---
start kube-apiserver "$BIN/kube-apiserver" --etcd-servers="$ETCD_URL" \
  --bind-address=127.0.0.1 --advertise-address=127.0.0.1 --secure-port="$P_API" \
  --cert-dir="$PKI" --tls-cert-file="$PKI/apiserver.crt" --tls-private-key-file="$PKI/apiserver.key" \
  --client-ca-file="$PKI/ca.crt" --token-auth-file="$PKI/tokens.csv" \
  --authorization-mode=RBAC --service-cluster-ip-range=10.96.0.0/16 \
  --service-account-issuer=https://kubernetes.default.svc.cluster.local \
  --service-account-key-file="$PKI/sa.pub" --service-account-signing-key-file="$PKI/sa.key" \
  --allow-privileged=true --profiling=false --v=1 \
  --disable-admission-plugins=TaintNodesByCondition --endpoint-reconciler-type=none
# service-cluster-ip-range: a /16 (65,534 ClusterIPs) so that thousands of resources each get their
#   Service (benchmarks/operator_scale.py --count 1000); a /24 ran out at 253.
# TaintNodesByCondition: it taints every new Node node.kubernetes.io/not-ready:NoSchedule, and
#   only the node-lifecycle-controller (not run: kwok owns node health) would remove it.
# endpoint-reconciler-type=none: the 'kubernetes' Endpoints may not point at a loopback address.
api_ready() { [ "$(curl -s --max-time 3 --cacert "$PKI/ca.crt" "$API_URL/readyz")" = ok ]; }
wait_for kube-apiserver "kube-apiserver $API_URL/readyz" api_ready
# proves token auth + RBAC (system:masters) end to end
"${KUBECTL[@]}" get --raw '/readyz?verbose' | grep -q 'poststarthook/rbac/bootstrap-roles ok'

# --- controllers, scheduler, kwok ---
start kube-controller-manager "$BIN/kube-controller-manager" --kubeconfig="$KUBECONFIG_FILE" \
  --leader-elect=false --secure-port=0 \
  --controllers=deployment-controller,replicaset-controller,garbage-collector-controller,namespace-controller,serviceaccount-controller,serviceaccount-token-controller,statefulset-controller,daemonset-controller,job-controller,cronjob-controller,endpointslice-controller,disruption-controller,pod-garbage-collector-controller,root-ca-certificate-publisher-controller,resourcequota-controller \
  --service-account-private-key-file="$PKI/sa.key" --root-ca-file="$PKI/ca.crt" \
  --use-service-account-credentials=false --v=1
start kube-scheduler "$BIN/kube-scheduler" --kubeconfig="$KUBECONFIG_FILE" \
  --leader-elect=false --secure-port=0 --v=1
start kwok "$BIN/kwok" --kubeconfig="$KUBECONFIG_FILE" --config="$BIN/kwok-stages.yaml" \
  --manage-all-nodes=false --manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake \
  --manage-nodes-with-label-selector= --manage-single-node= \
  --cidr=10.244.0.0/16 --node-ip=10.244.0.1 --node-lease-duration-seconds=40

# --- LeaderWorkerSet: CRD, controller on loopback, its webhooks pointed at it with the bed's CA ---
"${KUBECTL[@]}" apply --server-side -f "$BIN/lws-crd.yaml" >/dev/null
cat > "$ST/lws-config.yaml" <<EOF
apiVersion: config.lws.x-k8s.io/v1alpha1
kind: Configuration
leaderElection: {leaderElect: false}
internalCertManagement: {enable: false}
webhook: {host: 127.0.0.1, port: $P_LWS_WEBHOOK, certDir: $PKI/lws}
metrics: {bindAddress: "0"}
health: {healthProbeBindAddress: "127.0.0.1:$P_LWS_HEALTH"}
EOF
# (a condition polled: `kubectl wait` fails at once while the new CRD has no conditions yet)
lws_crd_established() { [ "$("${KUBECTL[@]}" get crd leaderworkersets.leaderworkerset.x-k8s.io \
  -o jsonpath='{.status.conditions[?(@.type=="Established")].status}')" = True ]; }
wait_for kube-apiserver "LeaderWorkerSet CRD Established" lws_crd_established
start lws-controller env KUBECONFIG="$KUBECONFIG_FILE" "$BIN/lws-controller" --config="$ST/lws-config.yaml" \
  --zap-log-level=info
lws_ready() { curl -sf --max-time 2 "http://127.0.0.1:$P_LWS_HEALTH/readyz" && \
  curl -s --max-time 2 --cacert "$PKI/ca.crt" -o /dev/null "https://127.0.0.1:$P_LWS_WEBHOOK/"; }
wait_for lws-controller "LeaderWorkerSet controller, webhooks https://127.0.0.1:$P_LWS_WEBHOOK" lws_ready
# The upstream manifests name an in-cluster Service; here the API server reaches the controller on
# loopback. The pod webhooks get the objectSelector LWS's kustomize patch adds (only its own pods).
"${KUBECTL[@]}" create --dry-run=client -o json -f "$BIN/lws-webhooks.yaml" \
  | python3 "$TESTBED_DIR/lws_webhooks.py" "https://127.0.0.1:$P_LWS_WEBHOOK" "$PKI/ca.crt" \
  | "${KUBECTL[@]}" apply --server-side -f - >/dev/null

# --- fake GPU nodes ---
"${KUBECTL[@]}" create -f "$TESTBED_DIR/nodes/" >/dev/null
nodes_ready() { "${KUBECTL[@]}" wait --for=condition=Ready node -l type=kwok --timeout=5s; }
wait_for kwok "6 fake GPU nodes Ready (kubectl wait)" nodes_ready
# the serviceaccount controller is up once 'default' exists (pods need it: admission plugin)
wait_for kube-controller-manager "serviceaccount default/default" "${KUBECTL[@]}" get serviceaccount default
pid_of kube-scheduler >/dev/null || { tb_log "kube-scheduler exited"; exit 1; }

prom_ready() { curl -sf --max-time 2 "http://127.0.0.1:$P_PROM/-/ready"; }
wait_for prometheus "Prometheus http://127.0.0.1:$P_PROM/-/ready" prom_ready

cat > "$ST/env" <<EOF
# source me: the test bed started by tests/testbed/up.sh
export KUBECONFIG=$KUBECONFIG_FILE
export PATH=$BIN:\$PATH
export KVSCALE_PROMETHEUS_URL=http://127.0.0.1:$P_PROM
EOF
tb_log "test bed is up in $(($(date +%s) - T0))s"
"${KUBECTL[@]}" get nodes -L nvidia.com/gpu.product >&2
usage
