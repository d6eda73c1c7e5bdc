"""The root of the exceptions rlproxy raises on purpose, so that a caller can tell "rlproxy said no" apart from
bugs and from the libraries' own errors. The tree:

    RlproxyError
    ├── RuleError (core/policy_rules.py)           a routing rule or policy name that cannot be used (ValueError)
    ├── UnsupportedContent (core/responses_chat.py)  a Responses content part with no chat form (ValueError)
    ├── JudgeOutputError (rewards/judge.py)        a judge reply that breaks the JSON contract (ValueError)
    ├── StoreError (store/errors.py)               NotFound, Conflict: what a store operation refused;
    │                                              TooManyEvents (store/events.py): a rollout's event budget spent;
    │                                              TooManyCallRewards (store/rewards.py): a call's reward budget;
    │                                              WeightsRemoved (store/policies.py): a version's folder is gone
    ├── BadQuery (store/browse.py)                 a filter or cursor of the web view's queries (ValueError)
    ├── AdapterError (engine/adapters.py)          EngineUnavailable, AdapterRefused, LoadFailed, UnloadFailed;
    │                                              NotVerified (engine/fleet.py): a replica serves other weights
    ├── EngineError (engine/command.py)            the local engine could not start, or died (RuntimeError)
    ├── ModelError (engine/model.py)               BundledModelMissing: the bundled model cannot be prepared
    ├── ModelListError (engine/model_list.py)      an engine's model list unreadable, or naming no base model
    ├── UnknownFamily (engine/families.py)         a model folder or --model-family of no known family (ValueError)
    ├── ProxyError (proxy/errors.py)               an HTTP error in the route's own format: InvalidRequest 400,
    │                                              Unauthorized 401, NotFoundError 404 (ModelNotFound,
    │                                              proxy/tenancy.py), RateLimited 429 (DecodersBusy,
    │                                              proxy/otlp/share.py: a project's share of the OTLP decoders
    │                                              is taken), UpstreamUnavailable 502,
    │                                              DecoderUnavailable 503 (proxy/otlp/decoding.py),
    │                                              ... (each carries its status)
    ├── AuthConfigError (proxy/edge/auth.py)       the access settings cannot be served as given
    ├── SpoolInUse (proxy/recording/spool.py)      another process writes this spool;
    │                                              SpoolForeign (proxy/recording/identity.py): its calls
    │                                              are for another database
    ├── SetAside (proxy/recording/spooling.py)     a call went to the rejected file instead (the writer's own flow)
    ├── OtlpFormatError (proxy/otlp/export.py)     a body that is no OTLP trace export (ValueError)
    ├── Exceeded, _Malformed (proxy/otlp/wire.py)  an export over its span/attribute budget; bytes not protobuf
    ├── EvalError (trainer/gates/evaluate.py)      `rlproxy eval` cannot measure what it was asked to
    ├── EvalCommandError (trainer/gates/command.py)  an --eval-command template that cannot run (ValueError)
    ├── JudgeUnreachable, JudgeRefused (trainer/judge.py)  the judge did not answer, or refused (RuntimeError)
    ├── MissingDependencyError (trainer/compat.py)  an OpenRLHF path needing a package not installed
    ├── CheckpointMismatchError (trainer/loading.py)  safetensors lacking a tensor the model needs (RuntimeError)
    ├── DeviceMemoryError (core/hardware.py)       the trainer's GPU lacks the free memory its model needs
    ├── AdapterMismatch (trainer/adapter.py)       a saved adapter made with another rank, alpha or targets (ValueError)
    ├── NoRoomForAdapter (trainer/retention.py)    too little free space for the next adapter version
    ├── TeacherRefused (trainer/teacher.py)        a teacher engine with another tokenizer, or none to check (ValueError);
    │                                              _Retry: a teacher request worth trying again (its own flow)
    ├── UnknownTargetModules (trainer/lora_targets.py)  LoRA targets the model's architecture lacks (ValueError)
    ├── EngineAway (proxy/token_text.py)           the engine cannot turn ids into text now (the web view's own flow)
    ├── RunInputError, ProxyRefused, InfrastructureError (runner/errors.py)  what stops `rlproxy run`, or an attempt
    ├── StartupError (demo/startup.py)             the demo cannot start (a taken port, low memory, ...)
    ├── CalcError (demo/calculator.py)             the demo agent's calculator refuses an expression (ValueError)
    ├── MissingExtra (rlproxy/extras.py)           a command whose extra is not installed (a click exception)
    ├── VocabularyMissing (testkit/model_kit/vocab.py)  a family's vocabulary package is not installed (tests only)
    ├── EncodingMismatch (testkit/model_kit/harmony.py)  o200k ranks that are not openai_harmony's file (tests only)
    ├── BadBody (testkit/stub_pooling.py)          the stand-in engine refuses a body (tests only; ValueError)
    └── EndStream (testkit/stub_faults.py)         the stand-in engine cuts a stream here (tests only)

Where an error also is a built-in kind (EngineError a RuntimeError, EvalCommandError a ValueError), it is both,
so code that catches the built-in keeps working. Errors are raised with their context and handled at the edge
(the proxy's error middleware, the CLI's messages).
"""
from __future__ import annotations


class RlproxyError(Exception):
    """Base of the errors rlproxy raises on purpose."""
