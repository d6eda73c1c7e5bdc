"""The proxy as the runner sees it: its public HTTP routes (`POST /rollouts`, `POST /reward`,
`GET /rollouts/{id}`, `GET /healthz`), with failures sorted into infrastructure (tried again) and refusals
(the run stops)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import aiohttp
from yarl import URL

from core.ids import is_valid_id
from runner.errors import InfrastructureError, ProxyRefused, RolloutRefused, RunInputError


@dataclass(frozen=True)
class NewRollout:
    rollout_id: str
    base_url: str  # ends in /rollouts/{id}/v1
    token: str | None = None  # the rollout's own token: what its agent is given (None: a proxy from before them)
    grader_token: str | None = None  # with a reward source other than the agent: what gives its final reward


def proxy_url(proxy: str) -> str:
    """`--proxy` as the base of every URL the runner and its agents use, or RunInputError saying why not: agents
    are handed URLs under it, so credentials in it (`http://user:secret@host`) would reach every agent, and a
    query or fragment would end up in the middle of their paths."""
    base = proxy.strip().rstrip("/")
    try:
        url = URL(base)
    except ValueError:
        url = URL()
    if url.scheme not in ("http", "https") or not url.host:
        raise RunInputError(f"--proxy {proxy!r}: not an http:// or https:// URL of the proxy")
    if url.user is not None or url.password is not None:
        raise RunInputError("--proxy: holds a user name or password, which every agent would be handed; give "
                            "the runner's key in RLPROXY_API_KEY (or --api-key-file)")
    if url.query_string or url.fragment:
        raise RunInputError(f"--proxy {proxy!r}: the proxy's URL has no query or fragment")
    return base


class ProxyClient:
    def __init__(self, proxy: str, api_key: str | None, timeout: float = 60.0) -> None:
        self.proxy = proxy_url(proxy)
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = aiohttp.ClientSession(headers=headers, timeout=aiohttp.ClientTimeout(total=timeout))

    async def close(self) -> None:
        await self._http.close()

    async def _call(self, method: str, path: str, body: dict[str, Any] | None = None,
                    headers: dict[str, str] | None = None) -> tuple[int, Any]:
        try:
            async with self._http.request(method, self.proxy + path, json=body, headers=headers) as response:
                status = response.status
                payload = await response.json(content_type=None) if await response.read() else None
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            raise InfrastructureError(f"{method} {path}: proxy unreachable ({type(exc).__name__}: {exc})") from None
        if status >= 500:
            raise InfrastructureError(f"{method} {path}: proxy answered {status} ({_message(payload)})")
        return status, payload

    async def healthy(self) -> bool:
        return await self.health_status() == 200

    async def health_status(self) -> int | None:
        """What `GET /healthz` answered (the proxy: 200), whatever the body; None when nothing answered."""
        try:
            async with self._http.get(self.proxy + "/healthz") as response:
                return response.status
        except (aiohttp.ClientError, TimeoutError):
            return None

    def not_the_proxy(self, status: int) -> str:
        """Why `--proxy` is not the proxy when a server answered its health check with `status`: a URL with /v1 in
        it (the proxy's OpenAI base URL, or an engine's), or another server (the engine itself)."""
        said = f"the server at {self.proxy} answered GET /healthz with {status}, where the proxy answers 200"
        url = URL(self.proxy)
        parts = url.path.split("/")
        if "v1" in parts:
            root = str(url.with_path("/".join(parts[:parts.index("v1")]) or "/")).rstrip("/")
            return f"{said}: --proxy is the proxy's root URL, without /v1 (--proxy {root})"
        return (f"{said}: is it the engine (vLLM) or another server? --proxy is the proxy's root URL, where "
                "`rlproxy serve` listens (no /v1), not the engine's")

    async def key_administers(self, key: str) -> bool:
        """Whether `key` is an administrator's (the operator's or a project's): the activation route answers any
        other key 403 before reading anything, and an administrator's 400 for a version that cannot exist, so the
        probe changes nothing. With keys off every caller passes that check, and no key administers anything."""
        probe = self.proxy + "/policies/not-a-version/activate"
        try:
            async with self._http.post(probe, headers={"Authorization": f"Bearer {key}"}) as with_key:
                if with_key.status != 400:  # 401/403: not an administrator's; anything else: it proves nothing
                    return False
            async with aiohttp.ClientSession(timeout=self._http.timeout) as anonymous:
                async with anonymous.post(probe) as without:
                    return without.status in (401, 403)
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise InfrastructureError(f"POST {probe}: proxy unreachable ({exc})") from None

    async def create_rollout(self, task_id: str, *, agent: str | None, evaluation: bool,
                             metadata: dict[str, Any], owner_key: str | None = None,
                             reward_source: str | None = None) -> NewRollout:
        """`owner_key`: the key whose project the rollout is (the agents' own, when they have one): a rollout the
        operator's key created belongs to no project, and a project's key may not add calls or rewards to it.
        `reward_source` "grader": the runner gives the final reward (with the grader token the answer holds),
        and a reward the agent posts is only a claim."""
        body = {"task_id": task_id, "metadata": metadata, "eval": evaluation}
        if agent:
            body["agent"] = agent
        if reward_source:
            body["reward_source"] = reward_source
        headers = {"Authorization": f"Bearer {owner_key}"} if owner_key else None
        status, payload = await self._call("POST", "/rollouts", body, headers=headers)
        if status in (401, 403):  # the runner's key: no attempt can go on
            raise ProxyRefused(f"POST /rollouts: {status} {_message(payload)}")
        if status == 429:
            raise InfrastructureError(f"POST /rollouts: {status} {_message(payload)}")
        if status != 201:  # what this attempt sent (its task id, its agent's name): this attempt fails
            raise RolloutRefused(f"the proxy refused this attempt's rollout (POST /rollouts: {status}): "
                                 f"{_message(payload)}")
        rollout_id = payload.get("rollout_id") if isinstance(payload, dict) else None
        if not isinstance(rollout_id, str) or not is_valid_id(rollout_id):
            raise ProxyRefused(f"POST /rollouts answered an unusable rollout id: {str(rollout_id)[:80]!r}")
        # the agent's URL from the proxy this runner was told to use (--proxy), not from the answer: behind a load
        # balancer that ends TLS or rewrites Host, the answer's origin can be plain http or another host, and the
        # agent would send its key there
        token, grader = payload.get("token"), payload.get("grader_token")
        if reward_source and not isinstance(grader, str):
            raise ProxyRefused("POST /rollouts answered no grader_token for a rollout the runner rewards: is the "
                               "proxy older than this runner? (rollout tokens came with migration 0015)")
        return NewRollout(rollout_id, f"{self.proxy}/rollouts/{rollout_id}/v1",
                          token if isinstance(token, str) else None, grader if isinstance(grader, str) else None)

    async def post_reward(self, rollout_id: str, reward: float, *, key: str | None = None) -> bool:
        """The final reward (with `key`: that credential, the rollout's grader token); False when the rollout
        already had another one (409), or kept it only as a claim (the key does not give its reward)."""
        headers = {"Authorization": f"Bearer {key}"} if key else None
        status, payload = await self._call("POST", "/reward", {"rollout_id": rollout_id, "reward": reward},
                                           headers=headers)
        if status == 409 or (status == 200 and isinstance(payload, dict) and payload.get("claim")):
            return False
        if status != 200:
            raise ProxyRefused(f"POST /reward: {status} {_message(payload)}")
        return True

    async def rollout(self, rollout_id: str) -> dict[str, Any] | None:
        """The rollout as stored (status, reward, rewards, trained, policy) with the summary of its calls
        (`summary`: how many, the versions that answered, their statuses), not the calls themselves: a page of
        them can be many MiB, and the runner asks at every attempt's end, on `--resume` and once a second per
        waiting rollout while pacing. None when the proxy does not know it."""
        status, payload = await self._call("GET", f"/rollouts/{rollout_id}?calls=false")
        if status == 404:
            return None
        if status != 200:
            raise ProxyRefused(f"GET /rollouts/{rollout_id}: {status} {_message(payload)}")
        return payload


def calls_summary(stored: dict[str, Any]) -> dict[str, Any]:
    """The `summary` of a rollout's calls, also from a proxy that answers `?calls=false` with its calls (one from
    before the summary form): the same shape, made from them."""
    if isinstance(stored.get("summary"), dict):
        return stored["summary"]
    calls = stored.get("calls") or []
    policies: dict[Any, dict[str, Any]] = {}
    statuses: dict[tuple, int] = {}
    for call in calls:
        seen = policies.setdefault(call.get("policy"), {"policy": call.get("policy"), "calls": 0,
                                                         "first_seq": call.get("seq"), "last_seq": call.get("seq")})
        seen["calls"] += 1
        seen["last_seq"] = call.get("seq")
        key = (call.get("status"), call.get("http_status"))
        statuses[key] = statuses.get(key, 0) + 1
    return {"call_count": len(calls), "policies": list(policies.values()),
            "statuses": [{"status": s, "http_status": h, "calls": n} for (s, h), n in statuses.items()]}


def _message(payload: Any) -> str:
    if isinstance(payload, dict) and isinstance(payload.get("error"), dict):
        return str(payload["error"].get("message"))
    return str(payload)[:200]
