"""Token ids bound for Postgres as the text of an `int[]`, cast there, instead of as a list for asyncpg to encode.

asyncpg's array encoder asks, for every element, whether it is itself an array (an `isinstance` against
`collections.abc.Iterable`, a Python-level call each) before it encodes it: 3.3 ms of the proxy's CPU for 10,000
ids on a loaded 2-core machine, on the event loop, in the writer's transaction. An agent's long history is that
many prompt ids in every call, so every other request waited for it (bench/results/profile_recording.txt: 57-62 %
of a 42 KB call's CPU was the store). orjson writes the same ids as JSON at C speed; with brackets made braces that
is the array's literal (`{1,2,3}`; a list of lists, a batch of legacy prompts, `{{1,2},{3,4}}`), which Postgres
reads in C. What is stored is the same array, read back as before; SQLite keeps its JSON column (not used here)."""
from __future__ import annotations

from typing import Any

import orjson
from sqlalchemy import Integer, Text, bindparam, cast
from sqlalchemy.dialects.postgresql import ARRAY

_BRACES = bytes.maketrans(b"[]", b"{}")


def id_array_text(ids: list[Any] | None) -> str | None:
    """The `int[]` literal of a list of ids (or of lists of ids); None stays None (SQL NULL)."""
    if ids is None:
        return None
    return orjson.dumps(ids).translate(_BRACES).decode()


def id_array_param(name: str):
    """The bound parameter `name`, sent as text and cast to `int[]` by Postgres."""
    return cast(bindparam(name, type_=Text), ARRAY(Integer))
