"""The root of the exceptions rlproxy's shared modules raise on purpose, so that a caller can catch "rlproxy
said no" apart from bugs and from the libraries' own errors."""
from __future__ import annotations


class RlproxyError(Exception):
    """Base of the errors rlproxy raises on purpose (rlproxy/adapters.py's, for one)."""
