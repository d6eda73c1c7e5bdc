"""What the fault tests wait on while a part is down or back: a condition polled until it holds, and a proxy's
readiness report."""
from __future__ import annotations

import time

import requests


def wait_until(check, timeout: float, every: float = 0.25):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := check():
            return value
        time.sleep(every)
    raise TimeoutError(f"not reached within {timeout}s")


def readyz(url: str) -> dict:
    return requests.get(url + "/readyz", timeout=10).json()
