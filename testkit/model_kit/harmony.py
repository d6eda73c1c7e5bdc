"""gpt-oss's harmony format offline: vLLM renders and parses gpt-oss chats with `openai_harmony` (the
`oss-harmony` package), whose encoding loader fetches `o200k_base.tiktoken` from the network unless the
environment variable `TIKTOKEN_ENCODINGS_BASE` names a folder holding it. The file is tiktoken's text format
(per token, by rank: its bytes in base64, a space, the rank) and the loader checks its SHA-256 against the
published one, so it must be byte for byte the o200k ranks; quicktok-v1's `o200k.vocab` holds the same ranks, and
`write_encoding` writes that file from them (checked against the same hash, so a wrong file fails here, not as a
download attempt inside the engine).
"""
from __future__ import annotations

import base64
import hashlib
from pathlib import Path

from core.errors import RlproxyError

ENCODINGS_ENV = "TIKTOKEN_ENCODINGS_BASE"
ENCODING_FILE = "o200k_base.tiktoken"
# what openai_harmony's loader requires of the file (the published o200k_base.tiktoken)
O200K_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"


class EncodingMismatch(RlproxyError, ValueError):
    """The o200k ranks written for harmony are not the published o200k_base file."""


def encoding_text(ranks: dict[bytes, int]) -> bytes:
    return b"".join(base64.b64encode(token) + b" %d\n" % rank
                    for token, rank in sorted(ranks.items(), key=lambda item: item[1]))


def write_encoding(folder: Path, ranks: dict[bytes, int]) -> Path:
    """`folder`/o200k_base.tiktoken from `ranks`; returns `folder`, the value for TIKTOKEN_ENCODINGS_BASE."""
    text = encoding_text(ranks)
    digest = hashlib.sha256(text).hexdigest()
    if digest != O200K_SHA256:
        raise EncodingMismatch(f"the o200k ranks hash to {digest}, not o200k_base's {O200K_SHA256}")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / ENCODING_FILE).write_bytes(text)
    return folder
