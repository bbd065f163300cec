{{/* Chart name, overridable with nameOverride. */}}
{{- define "kvscale.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Full name of the release's objects: fullnameOverride, else RELEASE or RELEASE-kvscale. */}}
{{- define "kvscale.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Name of cluster-scoped objects (ClusterRole, ClusterRoleBinding): unique per release namespace. */}}
{{- define "kvscale.clusterName" -}}
{{- printf "%s-%s" .Release.Namespace (include "kvscale.fullname" .) | trunc 253 | trimSuffix "-" -}}
{{- end -}}

{{- define "kvscale.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels of every object. */}}
{{- define "kvscale.labels" -}}
helm.sh/chart: {{ include "kvscale.chart" . }}
{{ include "kvscale.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: kvscale
{{- end -}}

{{/* Labels that select the operator pods (immutable in the Deployment). */}}
{{- define "kvscale.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kvscale.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "kvscale.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "kvscale.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* True ("true") when several replicas share the work through kopf peering. */}}
{{- define "kvscale.peered" -}}
{{- if gt (int .Values.replicaCount) 1 -}}true{{- end -}}
{{- end -}}

{{- define "kvscale.peeringName" -}}
{{- default (include "kvscale.fullname" .) .Values.peering.name -}}
{{- end -}}

{{- define "kvscale.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* The rules the operator needs on namespaced resources, in a ClusterRole or in a Role per namespace. */}}
{{- define "kvscale.namespacedRules" -}}
# LLMDeployments: watched by kopf, read on every reconcile, status written by the operator.
- apiGroups: [kvscale.dev]
  resources: [llmdeployments]
  verbs: [get, list, watch, patch]
- apiGroups: [kvscale.dev]
  resources: [llmdeployments/status]
  verbs: [get, patch, update]
# The serving Deployment kvscale owns (created, then patched on plan and scale changes; kopf
# watches them for drift). Deleted by kvscale only when its plan moves to multi-node replicas or a
# re-planning move (replan: Auto) has drained it (and only that uid); otherwise the garbage collector
# removes it with its LLMDeployment.
- apiGroups: [apps]
  resources: [deployments]
  verbs: [get, list, watch, create, patch, update, delete]
# Multi-node replicas: a LeaderWorkerSet (sigs.k8s.io/lws) kvscale owns, the same way.
- apiGroups: [leaderworkerset.x-k8s.io]
  resources: [leaderworkersets]
  verbs: [get, list, watch, create, patch, update, delete]
# The serving Service kvscale owns.
- apiGroups: [""]
  resources: [services]
  verbs: [get, create, patch]
# spec.model.configMapRef: a model's config.json kept in a ConfigMap (read only).
- apiGroups: [""]
  resources: [configmaps]
  verbs: [get]
# Readiness and start-up of the serving pods; patch: their pod-deletion-cost before a scale-down.
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch, patch]
# Events about LLMDeployments (kvscale's catalogue of reasons, and kopf's own).
- apiGroups: ["", events.k8s.io]
  resources: [events]
  verbs: [create, patch]
{{- end -}}

{{/* The operator's command-line flags (the image's entrypoint is `kvscale run`). */}}
{{- define "kvscale.args" -}}
- {{ printf "--scan-interval=%v" .Values.scanInterval | quote }}
- {{ printf "--liveness=http://0.0.0.0:%v/healthz" .Values.ports.health | quote }}
- {{ printf "--metrics-port=%v" .Values.ports.metrics | quote }}
- {{ printf "--log-level=%s" .Values.logLevel | quote }}
- {{ printf "--log-format=%s" .Values.logFormat | quote }}
{{- range .Values.watchNamespaces }}
- {{ printf "--namespace=%s" . | quote }}
{{- end }}
{{- with .Values.prometheusUrl }}
- {{ printf "--prometheus-url=%s" . | quote }}
- {{ printf "--metrics-window=%v" $.Values.metricsWindowSeconds | quote }}
{{- end }}
{{- range $gpu, $usd := .Values.gpuPrices }}
- {{ printf "--gpu-price=%s=%v" $gpu $usd | quote }}
{{- end }}
{{- if include "kvscale.peered" . }}
- {{ printf "--peering=%s" (include "kvscale.peeringName" .) | quote }}
- {{ printf "--peering-lifetime=%v" .Values.peering.lifetimeSeconds | quote }}
{{- end }}
{{- end -}}
