"""Where things are unless told otherwise: the store, the proxy, and the cache of prepared models."""
from __future__ import annotations

import os
from pathlib import Path

DEFAULT_DATABASE_URL = "sqlite+aiosqlite:///rlproxy.db"
DEFAULT_PROXY = "http://127.0.0.1:8400"  # `rlproxy serve`'s default host and port


def cache_dir() -> Path:
    """Where prepared models and adapters live unless told otherwise (`RLPROXY_CACHE_DIR`, read here: it is
    no command's flag)."""
    root = os.environ.get("RLPROXY_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "rlproxy"
    )
    return Path(root)
