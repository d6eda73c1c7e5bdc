"""Which policy, and which version of it, answers a call (router.py: named policies, canaries, a model asked for by
name, the base model), for how long a running rollout keeps the version it started on (pins.py), and the
operator's sampling for a policy's training calls (sampling.py, `rlproxy serve --rollout-sampling`)."""
from __future__ import annotations

from proxy.policy.router import AUTO_MODEL, PolicyRouter, Route
from proxy.policy.sampling import resample

__all__ = ["AUTO_MODEL", "PolicyRouter", "Route", "resample"]
