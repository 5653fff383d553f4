{{/* The EPP's name: the release (lower-cased, at most 40 characters) plus "-epp". */}}
{{- define "standin.eppName" -}}
{{- printf "%s-epp" (.Release.Name | lower | trim | trunc 40) -}}
{{- end -}}

{{/* The pod selector label; its key names the chart's mode (gateway here). */}}
{{- define "standin.selector" -}}
llm-d-router-gateway: {{ include "standin.eppName" . }}
{{- end -}}

{{- define "standin.gkePreferred" -}}
{{- ((.Values.provider.gke | default dict).preferredBackends | default dict).enabled | default false -}}
{{- end -}}
