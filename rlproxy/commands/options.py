"""What the commands print about their settings. Every command's flags come from its settings model
(core/settings/) through rlproxy/commands/flags.py."""
from __future__ import annotations

from sqlalchemy.engine import make_url


def redact(url: str) -> str:
    """A database URL fit to print: its password hidden."""
    return make_url(url).render_as_string(hide_password=True)
