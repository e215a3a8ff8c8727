{{/* The chart's name, for labels. */}}
{{- define "infinity.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The release's resource names: the release name, with the chart's unless it holds it already. */}}
{{- define "infinity.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "infinity.selectorLabels" -}}
app.kubernetes.io/name: {{ include "infinity.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "infinity.labels" -}}
{{ include "infinity.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The Node Feature Discovery labels (feature.node.kubernetes.io/cpu-cpuid.<FLAG>) of each target's required CPU
flags (optimize/presets.py); none: no CPU-flag affinity. */}}
{{- define "infinity.cpuFlags" -}}
{{- $flags := dict "sapphirerapids" (list "AVX512F" "AVX512VNNI" "AMXINT8" "AMXBF16")
                   "icelake" (list "AVX512F" "AVX512VNNI") "cascadelake" (list "AVX512F" "AVX512VNNI")
                   "skylake" (list "AVX512F" "AVX512BW") "avx2" (list "AVX2") "none" (list) -}}
{{- if not (hasKey $flags .Values.target) }}
{{- fail (printf "target %q: choose sapphirerapids, icelake, cascadelake, skylake, avx2 or none" .Values.target) }}
{{- end }}
{{- toJson (get $flags .Values.target) }}
{{- end }}

{{/* The selector of this release's series in Prometheus, as the ServiceMonitor's targets label them. */}}
{{- define "infinity.series" -}}
namespace="{{ .Release.Namespace }}",service="{{ include "infinity.fullname" . }}"
{{- end }}

{{/* At most one autoscaler; the name of the one on, or "". */}}
{{- define "infinity.autoscaler" -}}
{{- $on := list }}
{{- range $name := list "keda" "hpaQueueDepth" "hpaCpu" }}
{{- if (get $.Values.autoscaling $name).enabled }}
{{- $on = append $on $name }}
{{- end }}
{{- end }}
{{- if gt (len $on) 1 }}
{{- fail (printf "autoscaling: %s are on; turn on at most one" (join " and " $on)) }}
{{- end }}
{{- if and $on (gt (int $.Values.autoscaling.minReplicas) (int $.Values.autoscaling.maxReplicas)) }}
{{- fail "autoscaling.minReplicas is more than autoscaling.maxReplicas" }}
{{- end }}
{{- if $on }}{{ first $on }}{{ end }}
{{- end }}

{{- define "infinity.scaleTargetRef" -}}
apiVersion: apps/v1
kind: Deployment
name: {{ include "infinity.fullname" . }}
{{- end }}

{{- define "infinity.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: ["ALL"]
{{- end }}

{{/* Whole CPUs, requests equal to limits: Guaranteed QoS. */}}
{{- define "infinity.guaranteed" -}}
requests:
  cpu: {{ .cpu | quote }}
  memory: {{ .memory | quote }}
limits:
  cpu: {{ .cpu | quote }}
  memory: {{ .memory | quote }}
{{- end }}
