"""Adapter swaps under load against the real engine: failed requests during swaps (target 0), time from a
finished step to the new version serving (target <= 2 s), the engine's adapter load time, and the slowest
request. The load and the publishing are testkit/swap_load.py (the same code the swap test asserts on).

    python bench/swaps.py [--engine-url http://127.0.0.1:8000] [--versions 6] [--agents 4]
Without --engine-url it starts the local engine with the bundled model (30-90 s).
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from engine.model import prepare_model  # noqa: E402
from testkit.processes import free_port, proxy_command, running  # noqa: E402
from testkit.swap_load import make_adapter_versions, swap_under_load  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engine-url", default=None)
    parser.add_argument("--database-url", default=None,
                        help="A database with no policies yet (default: a new SQLite file in a temp dir).")
    parser.add_argument("--versions", type=int, default=6)
    parser.add_argument("--agents", type=int, default=4)
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="rlproxy-swaps-"))
    database_url = args.database_url or f"sqlite+aiosqlite:///{workdir / 'rlproxy.db'}"
    with contextlib.ExitStack() as stack:
        engine_url = args.engine_url
        if engine_url is None:
            from core.settings import EngineSettings
            from engine.local import Engine

            engine = stack.enter_context(Engine(EngineSettings(port=free_port(), max_model_len=2048, kv_cache_gib=1)))
            engine_url = engine.base_url
        model = Path(prepare_model())
        port = free_port()
        proxy = f"http://127.0.0.1:{port}"
        stack.enter_context(running(proxy_command(port, [engine_url], database_url, "--spool-path",
                                                  str(workdir / "spool.jsonl")), proxy + "/healthz",
                                    log_path=workdir / "proxy.log"))
        adapters = make_adapter_versions(model, workdir / "adapters", args.versions)
        report = asyncio.run(swap_under_load(proxy, engine_url, model.name, database_url, adapters,
                                             agents=args.agents))
    print(report.summary())
    print(f"failed requests during swaps: {len(report.failures)} (target 0)")
    print(f"step end -> new version serving: median {sorted(report.publish_to_serving)[len(report.publish_to_serving) // 2]:.2f}s"
          f" (target <= 2 s)")


if __name__ == "__main__":
    main()
