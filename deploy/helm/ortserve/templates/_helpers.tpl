{{- define "ortserve.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "ortserve.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "ortserve.labels" -}}
{{ include "ortserve.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* SIGTERM to exit: the preStop sleep, the shutdown delay, the drain, and a margin. */}}
{{- define "ortserve.terminationGrace" -}}
{{- add .Values.shutdown.preStopSleepSeconds .Values.shutdown.delaySeconds .Values.shutdown.graceSeconds 5 -}}
{{- end -}}
