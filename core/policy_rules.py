"""Which named policy answers a call: routing rules over the call's project and agent.

A rule is `CONDITIONS=POLICY`, CONDITIONS being one or more `agent:NAME` / `project:NAME` joined by `&`:

    agent:planner=planner             the planner role learns as its own policy
    agent:checker=base                the checker is always the base model (never trained)
    project:acme=acme                 tenant acme's calls are answered (and trained) apart from everyone else's
    project:acme&agent:coder=acme-coder

Rules are tried in order; the first whose conditions all hold names the policy. A call no rule matches gets
the default policy (`default` unless set; `base` serves unlisted agents with the base model). The name `base`
is reserved: the base model, no versions, never trained. Pure: the proxy routes with it, settings validate
with it. `version_hold`: how long a running rollout keeps the version of its policy its first call got once a
newer one serves (0: the newest at once; proxy/policy/pins.py).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from core.errors import RlproxyError

DEFAULT_POLICY = "default"  # the policy every call belongs to unless a routing rule names another
BASE_POLICY = "base"  # a reserved name: always the base model, never trained

__all__ = ["BASE_POLICY", "DEFAULT_POLICY", "PolicyRules", "Rule", "RuleError", "check_policy_name"]

_NAME = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
_KEYS = ("agent", "project")


class RuleError(RlproxyError, ValueError):
    """A routing rule or policy name that cannot be used; the message says which and why."""


def check_policy_name(name: str) -> str:
    if not _NAME.match(name):
        raise RuleError(f"policy name {name!r} must be 1-64 letters, digits and ._-")
    return name


@dataclass(slots=True, frozen=True)
class Rule:
    conditions: tuple[tuple[str, str], ...]  # (key, value) pairs that must all hold
    policy: str

    @classmethod
    def parse(cls, text: str) -> Rule:
        left, sep, policy = text.strip().rpartition("=")
        if not sep or not left:
            raise RuleError(f"policy rule {text!r} is not CONDITIONS=POLICY (e.g. agent:planner=planner)")
        conditions = []
        for part in left.split("&"):
            key, colon, value = part.strip().partition(":")
            if not colon or key not in _KEYS or not value:
                raise RuleError(f"policy rule {text!r}: condition {part!r} must be agent:NAME or project:NAME")
            conditions.append((key, value))
        return cls(tuple(conditions), check_policy_name(policy.strip()))

    def matches(self, agent: str | None, project: str | None) -> bool:
        given = {"agent": agent, "project": project}
        return all(given[key] == value for key, value in self.conditions)

    @property
    def needs_agent(self) -> bool:
        return any(key == "agent" for key, _ in self.conditions)

    def __str__(self) -> str:
        return "&".join(f"{k}:{v}" for k, v in self.conditions) + f"={self.policy}"


@dataclass(slots=True, frozen=True)
class PolicyRules:
    rules: tuple[Rule, ...] = ()
    default: str = DEFAULT_POLICY
    version_hold: float = 0.0  # seconds a running rollout keeps its starting version after a newer one serves

    @classmethod
    def parse(cls, rules: tuple[str, ...] | list[str] = (), default: str = DEFAULT_POLICY,
              version_hold: float = 0.0) -> PolicyRules:
        return cls(tuple(Rule.parse(r) for r in rules), check_policy_name(default), version_hold)

    def choose(self, agent: str | None, project: str | None) -> str:
        """The policy that answers a call of `agent` in `project` (either may be unknown)."""
        for rule in self.rules:
            if rule.matches(agent, project):
                return rule.policy
        return self.default

    @property
    def needs_agent(self) -> bool:
        """Whether any rule looks at the agent (then a call without one is looked up by its rollout)."""
        return any(rule.needs_agent for rule in self.rules)

    def reachable(self, project: str | None) -> set[str]:
        """Every policy some call of `project` can be routed to, whatever its agent: the policies whose
        adapters that project's keys may also call by name (proxy/tenancy.py)."""
        found: set[str] = set()
        for rule in self.rules:
            projects = {value for key, value in rule.conditions if key == "project"}
            agents = {value for key, value in rule.conditions if key == "agent"}
            if projects - {project} or len(agents) > 1:  # never matches a call of this project
                continue
            found.add(rule.policy)
            if not agents:  # matches every call of the project: the rules after it and the default never do
                return found
        return found | {self.default}

    def owned_by(self, project: str) -> set[str]:
        """The policies only calls of `project` can be routed to: named by rules, and by no rule that a call
        of another project could match. The default policy answers every project no rule names, so it is
        nobody's; a policy no rule names (only in the store) is nobody's either. What a project admin key may
        activate (proxy/routes/policies.py)."""
        named: dict[str, bool] = {}
        for rule in self.rules:
            own = ("project", project) in rule.conditions
            named[rule.policy] = named.get(rule.policy, True) and own
        return {policy for policy, own in named.items() if own and policy not in (self.default, BASE_POLICY)}

    def policies(self) -> list[str]:
        """Every policy the rules can name, the default first; `base` left out (it has no adapter)."""
        named = [self.default, *(rule.policy for rule in self.rules)]
        return [p for i, p in enumerate(named) if p != BASE_POLICY and p not in named[:i]]
