{{/* Names */}}
{{- define "rlproxy.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "rlproxy.fullname" -}}
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

{{/* Labels; call with (dict "ctx" $ "component" "proxy") */}}
{{- define "rlproxy.selectorLabels" -}}
app.kubernetes.io/name: {{ include "rlproxy.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "rlproxy.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .ctx.Chart.Name .ctx.Chart.Version | replace "+" "_" }}
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
app.kubernetes.io/version: {{ .ctx.Chart.AppVersion | quote }}
app.kubernetes.io/part-of: rlproxy
{{ include "rlproxy.selectorLabels" . }}
{{- end }}

{{/* An image reference; call with (dict "ctx" $ "image" .Values.proxy.image) */}}
{{- define "rlproxy.image" -}}
{{- printf "%s:%s" .image.repository (default .ctx.Chart.AppVersion .image.tag) }}
{{- end }}

{{/* Where the database URL comes from: the chart's own Secret when it knows the URL (database.url or the
bundled Postgres), else the Secret named by database.existingSecret. */}}
{{- define "rlproxy.databaseFromChart" -}}
{{- if or .Values.postgresql.enabled .Values.database.url }}true{{ end }}
{{- end }}

{{- define "rlproxy.databaseSecret" -}}
{{- if include "rlproxy.databaseFromChart" . }}
{{- include "rlproxy.fullname" . }}
{{- else }}
{{- required "database.url, database.existingSecret or postgresql.enabled is required" .Values.database.existingSecret }}
{{- end }}
{{- end }}

{{- define "rlproxy.databaseSecretKey" -}}
{{- if include "rlproxy.databaseFromChart" . }}database-url{{ else }}{{ .Values.database.existingSecretKey }}{{ end }}
{{- end }}

{{- define "rlproxy.databaseUrl" -}}
{{- if .Values.postgresql.enabled }}
{{- with .Values.postgresql.auth }}
{{- printf "postgresql+asyncpg://%s:%s@%s-postgresql:5432/%s" .username .password ($.Release.Name | trunc 52) .database }}
{{- end }}
{{- else }}
{{- .Values.database.url }}
{{- end }}
{{- end }}

{{/* The Secret and key holding the admin key */}}
{{- define "rlproxy.authSecret" -}}
{{- default (include "rlproxy.fullname" .) .Values.auth.existingSecret }}
{{- end }}

{{- define "rlproxy.authSecretKey" -}}
{{- if .Values.auth.existingSecret }}{{ .Values.auth.existingSecretKey }}{{ else }}admin-key{{ end }}
{{- end }}

{{/* Engine base URLs (no /v1), space-separated as RLPROXY_UPSTREAM expects */}}
{{- define "rlproxy.upstreams" -}}
{{- $urls := list }}
{{- if .Values.engine.enabled }}
{{- $set := printf "%s-engine" (include "rlproxy.fullname" .) }}
{{- range $i, $_ := until (int .Values.engine.replicas) }}
{{- /* each replica by its own name (the StatefulSet's pod i through its headless Service) */}}
{{- $urls = append $urls (printf "http://%s-%d.%s:%d" $set $i $set (int $.Values.engine.port)) }}
{{- end }}
{{- end }}
{{- $urls = concat $urls .Values.engine.externalUrls }}
{{- if not $urls }}{{ fail "no engine: set engine.enabled=true or engine.externalUrls" }}{{ end }}
{{- join " " $urls }}
{{- end }}

{{- define "rlproxy.adaptersClaim" -}}
{{- default (printf "%s-adapters" (include "rlproxy.fullname" .)) .Values.adapters.existingClaim }}
{{- end }}

{{/* The database URL as an environment variable */}}
{{- define "rlproxy.databaseEnv" -}}
- name: RLPROXY_DATABASE_URL
  valueFrom:
    secretKeyRef:
      name: {{ include "rlproxy.databaseSecret" . }}
      key: {{ include "rlproxy.databaseSecretKey" . }}
{{- end }}

{{/* Training processes (ranks) per trainer pod: trainer.nprocPerNode, else one per GPU, else one */}}
{{- define "rlproxy.trainerNprocPerNode" -}}
{{- $gpu := int .Values.trainer.gpu }}
{{- $nproc := int (default (max $gpu 1) .Values.trainer.nprocPerNode) }}
{{- if and (gt $gpu 0) (ne $nproc $gpu) }}
{{- fail (printf "trainer.nprocPerNode (%d) must equal trainer.gpu (%d): each rank trains on one GPU of its own" $nproc $gpu) }}
{{- end }}
{{- $nproc }}
{{- end }}
