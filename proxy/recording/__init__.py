"""Recording: every call the proxy captured, stored. The capture writer (writer.py) is the only task that writes
calls; while the database is away they wait in the spool (spool.py, its lock: lock.py, its disk: space.py,
written there by spooling.py), tied to the database they are for (identity.py), and are replayed oldest first
(replay.py) in transactions that split a failing batch (transactions.py); a call that cannot be stored is set
aside in the rejected file (rejected.py). The spool's line format is lines.py's alone. The writer is restarted
when it fails (supervisor.py); the automatic rewards of what it stores are scored in its transaction (air.py);
`--redact-content` strips a call's texts before it is handed over (redact.py).

This is the wing's one door: the rest of the proxy imports only what this module exports, never a module inside."""
from __future__ import annotations

from proxy.recording.air import air_rules, automatic_rewards
from proxy.recording.identity import SpoolForeign
from proxy.recording.redact import redact_record
from proxy.recording.spool import SpoolInUse
from proxy.recording.writer import CaptureWriter

__all__ = ["CaptureWriter", "SpoolForeign", "SpoolInUse", "air_rules", "automatic_rewards", "redact_record"]
