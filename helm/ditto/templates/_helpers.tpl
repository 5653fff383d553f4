{{/* Chart name, truncated to the 63 characters a label allows. */}}
{{- define "ditto.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Fully qualified app name: the release name, with the chart name unless it holds it. */}}
{{- define "ditto.fullname" -}}
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

{{- define "ditto.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "ditto.selectorLabels" -}}
app.kubernetes.io/name: {{ include "ditto.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "ditto.labels" -}}
helm.sh/chart: {{ include "ditto.chart" . }}
{{ include "ditto.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: digital-twin
app.kubernetes.io/part-of: llm-d
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "ditto.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "ditto.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "ditto.image" -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag }}
{{- if .Values.image.registry }}
{{- printf "%s/%s:%s" .Values.image.registry .Values.image.repository $tag }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository $tag }}
{{- end }}
{{- end }}

{{/* The cluster YAML `ditto serve --config` reads. */}}
{{- define "ditto.clusterYaml" -}}
{{ toYaml .Values.cluster }}
{{- end }}

{{/* Probe scheme: HTTPS once TLS is on. */}}
{{- define "ditto.httpScheme" -}}
{{- if .Values.tls.enabled }}HTTPS{{ else }}HTTP{{ end }}
{{- end }}

{{/* "true" when the live mirror finds pods through the Kubernetes API. */}}
{{- define "ditto.kubeDiscovery" -}}
{{- if and .Values.mirror.enabled (or .Values.mirror.podsSelector .Values.mirror.inferencePool) -}}
true
{{- else -}}
false
{{- end -}}
{{- end }}
