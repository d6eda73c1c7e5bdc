"""What moving a running rollout to a new version costs the engine: vLLM keys its prefix cache by adapter, so the
first call under a newly published version prefills the rollout's whole context again (`--rollout-version-hold`,
docs/learning.md, Which version a running rollout gets).

    python bench/rollout_version.py --out bench/results/rollout_version.txt

Starts the local engine (CPU vLLM, the bundled model, 30-90 s), loads two adapter versions (the same weights under
two names, as two published versions are to the cache), and for each context length sends one context three times
with max_tokens 1: under v1 the first time (cold), under v1 again (what a held rollout's next call costs: the
context is cached), under v2 (what moving to the newest costs: cold again). Each length's context is new text, so
no earlier request warms it. Latency is the whole request as the client sees it.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import requests  # noqa: E402

from engine.model import prepare_model  # noqa: E402
from testkit.processes import free_port  # noqa: E402


def timed(url: str, model: str, prompt: list[int]) -> float:
    began = time.perf_counter()
    answer = requests.post(f"{url}/v1/completions", json={"model": model, "prompt": prompt, "max_tokens": 1,
                                                          "temperature": 0}, timeout=600)
    answer.raise_for_status()
    return time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=lambda s: [int(x) for x in s.split(",")], default=[512, 1024, 2048, 3584])
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    from core.settings import EngineSettings
    from engine.adapters import EngineAdapters
    from engine.local import Engine
    from testkit.swap_load import make_adapter_versions

    workdir = Path(tempfile.mkdtemp(prefix="rlproxy-rollout-version-"))
    model = Path(prepare_model())
    lines = [f"# python bench/rollout_version.py --lengths {','.join(map(str, args.lengths))} (CPU vLLM, the bundled "
             "model in float32, one request at a time; seconds per request of max_tokens 1)",
             "| context tokens | v1 cold | v1 again (held) | v2 (moved to the newest) | moved / held |",
             "|---|---|---|---|---|"]
    with contextlib.ExitStack() as stack:
        engine = stack.enter_context(Engine(EngineSettings(port=free_port(), max_model_len=4096, kv_cache_gib=1)))
        v1, v2 = make_adapter_versions(model, workdir / "adapters", 2)
        adapters = EngineAdapters([engine.base_url])
        asyncio.run(adapters.load("rollout-v1", str(v1)))
        asyncio.run(adapters.load("rollout-v2", str(v2)))
        timed(engine.base_url, "rollout-v1", [1, 2, 3])  # warm-up: first-request compilation
        print("\n".join(lines), flush=True)
        rng = random.Random(0)
        for length in args.lengths:
            prompt = [rng.randrange(100, 40_000) for _ in range(length)]
            cold, held, moved = (timed(engine.base_url, name, prompt)
                                 for name in ("rollout-v1", "rollout-v1", "rollout-v2"))
            line = f"| {length} | {cold:.2f} | {held:.2f} | {moved:.2f} | {moved / held:.1f}x |"
            print(line, flush=True)
            lines.append(line)
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
