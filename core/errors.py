"""The root of the exceptions rlproxy raises on purpose, so that a caller can tell "rlproxy said no" apart from
bugs and from the libraries' own errors. The tree:

    RlproxyError
    ├── ProxyError (proxy/errors.py)          an HTTP error in the route's own format: InvalidRequest 400,
    │                                         Unauthorized 401, NotFoundError 404, RateLimited 429,
    │                                         UpstreamUnavailable 502, ... (each carries its status)
    ├── AuthConfigError (proxy/auth.py)       the access settings cannot be served as given
    ├── UnsupportedContent (core/responses_chat.py)  a Responses content part with no chat form (a ValueError)
    ├── StoreError (store/errors.py)          NotFound, Conflict: what a store operation refused
    ├── AdapterError (engine/adapters.py)    EngineUnavailable, AdapterRefused, LoadFailed, UnloadFailed
    ├── EngineError (engine/command.py)  the local engine could not start, or died
    ├── ModelError (engine/model.py)         BundledModelMissing: the bundled model cannot be prepared
    ├── EvalError (trainer/gates/evaluate.py)       `rlproxy eval` cannot measure what it was asked to
    ├── EvalCommandError (trainer/gates/command.py)  an --eval-command template that cannot run
    ├── MissingDependencyError (trainer/compat.py)   an OpenRLHF path needing a package not installed
    └── StartupError (demo/startup.py)        the demo cannot start (a taken port, low memory, ...)

Where an error also is a built-in kind (EngineError a RuntimeError, EvalCommandError a ValueError), it is both,
so code that catches the built-in keeps working. Errors are raised with their context and handled at the edge
(the proxy's error middleware, the CLI's messages).
"""
from __future__ import annotations


class RlproxyError(Exception):
    """Base of the errors rlproxy raises on purpose."""
