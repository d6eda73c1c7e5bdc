"""What each durability mode adds to a call's path before its answer: `CaptureWriter.commit` of a typical chat call
(the stub's answer, 12 prompt and 9 completion tokens), in-process, the modes interleaved run by run. The writer
task is not started, so no database takes part and nothing else competes: the numbers are the request path's own
cost (bench/load.py measures the same end to end, where the machine's noise is far larger).

    python bench/spool_write.py [--calls 3000] [--runs 7]
"""
from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from core.settings import WriterSettings  # noqa: E402
from proxy.metrics import ProxyMetrics  # noqa: E402
from proxy.recording.writer import CaptureWriter  # noqa: E402
from store.db import open_database, session_factory  # noqa: E402
from store.models import utcnow  # noqa: E402
from store.records import CallRecord, ChoiceRecord  # noqa: E402

MODES = ("batch", "spool", "sync")


def call() -> CallRecord:
    return CallRecord(
        id=uuid.uuid4().hex, route="chat", started_at=utcnow(), finished_at=utcnow(), rollout_id=uuid.uuid4().hex,
        model="stub-model", upstream_model="stub-model", policy_version=0, policy="default", http_status=200,
        request={"model": "stub-model", "max_tokens": 16, "messages": [{"role": "user", "content": "What is 6*7?"}]},
        response={"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "stub-model",
                  "choices": [{"index": 0, "finish_reason": "stop", "message": {
                      "role": "assistant", "content": "The answer is 42 and that settles it ."}}],
                  "usage": {"prompt_tokens": 12, "completion_tokens": 9, "total_tokens": 21}},
        prompt_token_ids=list(range(100, 112)), latency_ms=1.0,
        choices=[ChoiceRecord(0, list(range(200, 209)), [-0.05] * 9, "stop")])


async def measure(mode: str, calls: int, workdir: Path) -> float:
    """Microseconds per `commit`, `calls` calls one after another (as one agent's would be)."""
    database = open_database(f"sqlite+aiosqlite:///{workdir / 'unused.db'}")
    settings = WriterSettings(spool_path=workdir / f"{mode}-{uuid.uuid4().hex[:6]}.jsonl", durability=mode,
                              queue_size=calls + 1)
    writer = CaptureWriter(session_factory(database), settings, ProxyMetrics())
    records = [call() for _ in range(calls)]
    began = time.perf_counter()
    for record in records:
        await writer.commit(record)
    seconds = time.perf_counter() - began
    await writer.spool.close()  # what was not stored stays in the file: this folder is thrown away
    await database.dispose()
    return seconds / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    results: dict[str, list[float]] = {mode: [] for mode in MODES}
    with tempfile.TemporaryDirectory(prefix="rlproxy-spool-write-") as folder:
        for _ in range(args.runs):
            for mode in MODES:
                results[mode].append(asyncio.run(measure(mode, args.calls, Path(folder))))
    print(f"CaptureWriter.commit, µs per call: median of {args.runs} runs of {args.calls} calls [lowest, highest]")
    for mode, values in results.items():
        print(f"  {mode:<6} {statistics.median(values):8.1f} [{min(values):.1f}, {max(values):.1f}]")


if __name__ == "__main__":
    main()
