"""One project's traffic does not spend another project's limits. Keys of several projects often reach the proxy
from one address (a gateway, a NAT, one machine running many agents); the look-up limit on unknown keys is per
address, so it must not turn away the real keys of a project that happens to share the address with a sender
of made-up keys (`--key-lookup-rate`, docs/security.md)."""
from __future__ import annotations

import asyncio
import time

import requests

from store.keys import hash_key, list_keys, new_key, revoke_key
from tests.support import free_port, fresh_database, make_key, running_proxy, transaction


def exhaust(policies) -> None:
    """Made-up keys from this address until the proxy turns them away (429): its look-up budget is spent."""
    answers = [policies(new_key()) for _ in range(3)]
    while answers[-1] != 429 and len(answers) < 100:
        answers.append(policies(new_key()))
    assert answers[-1] == 429, answers


def test_made_up_keys_from_a_shared_address_do_not_lock_out_another_projects_real_key(postgres_server, run_dir):
    with fresh_database(postgres_server) as database_url:
        beta = make_key(database_url, "beta")
        dead_engine = f"http://127.0.0.1:{free_port()}"
        with running_proxy([dead_engine], database_url, run_dir, "proxy-shared-address", "--auth", "on",
                           "--key-lookup-rate", "2", "--key-cache-ttl", "0.5") as url:
            def policies(key: str) -> int:
                return requests.get(f"{url}/policies", headers={"Authorization": f"Bearer {key}"}).status_code

            assert policies(beta) == 200  # beta's agent, known to this proxy from now on
            exhaust(policies)  # another client at the same address, sending made-up keys
            time.sleep(0.6)  # beta's cached entry expires: its next call is looked up again
            exhaust(policies)  # the flood goes on
            assert policies(beta) == 200  # was 429 "too many unknown API keys from this address"
            assert policies(new_key()) == 429  # the made-up keys are still turned away


def test_a_revoked_key_is_looked_up_like_any_unknown_key_once_found_revoked(postgres_server, run_dir):
    """A key found before skips the look-up limit only while it is a key: once found revoked it is an unknown
    key again, limited with the others."""
    with fresh_database(postgres_server) as database_url:
        alpha = make_key(database_url, "alpha")
        dead_engine = f"http://127.0.0.1:{free_port()}"
        with running_proxy([dead_engine], database_url, run_dir, "proxy-revoked-lookups", "--auth", "on",
                           "--key-lookup-rate", "2", "--key-cache-ttl", "0.3") as url:
            def policies(key: str) -> int:
                return requests.get(f"{url}/policies", headers={"Authorization": f"Bearer {key}"}).status_code

            assert policies(alpha) == 200

            async def revoke() -> None:  # as `rlproxy keys revoke` does
                async with transaction(database_url) as db:
                    [row] = [k for k in await list_keys(db, "alpha") if k.key_hash == hash_key(alpha)]
                    await revoke_key(db, row.id)

            asyncio.run(revoke())
            time.sleep(0.4)
            assert policies(alpha) == 401  # looked up again (the key was known), found revoked
            time.sleep(0.4)  # that answer's cached entry expires
            exhaust(policies)
            assert policies(alpha) == 429  # no longer a known key: it waits behind the limit like any other
