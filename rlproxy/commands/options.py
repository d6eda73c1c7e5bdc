"""What every `rlproxy` command's flags share: each flag also reads `RLPROXY_<FLAG>` from the environment."""
from __future__ import annotations

import click

from rlproxy.settings import DEFAULT_DATABASE_URL

def env(name: str) -> str:
    return "RLPROXY_" + name.upper().replace("-", "_")


def option(*names: str, **kwargs):
    """A click option whose environment variable is `RLPROXY_<LONG FLAG>`."""
    long = next(n for n in names if n.startswith("--")).lstrip("-").split("/")[0]
    return click.option(*names, envvar=env(long), show_envvar=True, show_default=True, **kwargs)


def database_option():
    return option("--database-url", default=DEFAULT_DATABASE_URL, help="SQLAlchemy async database URL.")


def auth_options(command):
    """`serve`'s access flags; they arrive as keyword arguments named like AuthSettings' fields."""
    flags = [
        option("--auth", "mode", type=click.Choice(["auto", "on", "off"]), default="auto",
               help="Require API keys. auto: when any key exists; a non-loopback --host without keys is "
                    "refused unless --auth off."),
        option("--admin-key", default=None,
               help="Operator key with admin rights over every project (policy activation, metrics)."),
        option("--key-cache-ttl", default=30.0, type=float,
               help="Seconds key lookups are cached (a revoked key may work this long)."),
        option("--rate-limit", default=None, type=float,
               help="Requests per second per key (default: unlimited)."),
        option("--rate-burst", default=None, type=int,
               help="Requests a key may send at once (default: the rate)."),
        option("--max-tokens", default=None, type=int, help="Largest max_tokens a request may ask for."),
        option("--max-n", default=None, type=int, help="Largest n (completions per request) accepted."),
        option("--redact-content/--no-redact-content", default=False,
               help="Store message and completion text as a marker (token ids are kept)."),
        option("--upstream-api-key", default=None,
               help="Bearer key the proxy sends to the engines (agents' keys are never passed on)."),
    ]
    for flag in reversed(flags):
        command = flag(command)
    return command


def redact(url: str) -> str:
    """A database URL fit to print: its password hidden."""
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)
