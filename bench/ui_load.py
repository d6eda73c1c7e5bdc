"""How fast the web view opens at scale, in a real headless Chromium: the rollout list over 100,000 rollouts and a
rollout of 5,000 calls.

    .venv/bin/python bench/ui_load.py                       # Postgres on 127.0.0.1:5432 (or RLPROXY_TEST_POSTGRES)
    .venv/bin/python bench/ui_load.py --rollouts 20000 --calls 1000 --out -

A fresh database is filled with Postgres' own generate_series (rollouts over 1,000 tasks and 5 agents, rewards in
[0, 1]; one rollout holding the calls, each with a chat request and answer and 64 completion token ids with their
logprobs); `rlproxy serve` runs on it in front of the stand-in engine. Per page, the time from navigation to the
page's content being on screen, median of `--repeat` fresh tabs: the list (first page, 50 rows, with its total),
the list filtered by agent and reward and sorted by reward, its 100th page reached by cursor, and the big rollout
(its summary, rewards and first 20 calls with their coloured tokens).
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.learning_runs import cpu_model  # noqa: E402
from testkit.processes import fresh_database, free_port, running, running_proxy, stub_command  # noqa: E402
from store.browse import TOTAL_CAP  # noqa: E402

BIG = "big-rollout"


def libpq(url: str) -> str:
    return url.replace("postgresql+asyncpg://", "postgresql://")


def fill(database_url: str, rollouts: int, calls: int) -> float:
    started = time.perf_counter()
    with psycopg.connect(libpq(database_url), autocommit=True) as db:
        db.execute("""
            INSERT INTO rollouts (id, task_id, agent, status, reward, policy_version, eval, call_count, created_at,
                                  finished_at)
            SELECT md5(i::text), 'task-' || mod(i, 1000), 'agent-' || mod(i, 5), 'finished', mod(i, 7) / 6.0, mod(i, 10),
                   false, 3, now() - i * interval '1 second', now() - i * interval '1 second' + interval '2 second'
            FROM generate_series(1, %s) AS i""", (rollouts,))
        db.execute("""INSERT INTO rollouts (id, task_id, agent, status, reward, policy_version, eval, call_count,
                      created_at) VALUES (%s, 'task-big', 'agent-big', 'finished', 1.0, 3, false, %s, now())""",
                   (BIG, calls))
        db.execute("""
            INSERT INTO calls (id, rollout_id, seq, agent, task_id, route, model, policy_version, policy, stream,
                               status, http_status, request, response, prompt_token_ids, prompt_tokens,
                               completion_tokens, latency_ms, started_at)
            SELECT 'call-' || i, %s, i, 'agent-big', 'task-big', 'chat', 'stub-model', 3, 'default', false, 'ok', 200,
                   jsonb_build_object('model', 'stub-model', 'messages', jsonb_build_array(
                       jsonb_build_object('role', 'user', 'content', 'Step ' || i || ': what is ' || i || '*7?'))),
                   jsonb_build_object('choices', jsonb_build_array(jsonb_build_object('index', 0, 'finish_reason',
                       'stop', 'message', jsonb_build_object('role', 'assistant', 'content', 'It is ' || i * 7)))),
                   ARRAY(SELECT mod(i * 31 + j, 49152) FROM generate_series(1, 200) AS j), 200, 64,
                   20 + mod(i, 50), now()
            FROM generate_series(1, %s) AS i""", (BIG, calls))
        db.execute("""
            INSERT INTO call_choices (call_id, index, token_ids, logprobs, finish_reason)
            SELECT 'call-' || i, 0, ARRAY(SELECT mod(i * 17 + j, 49152) FROM generate_series(1, 64) AS j),
                   ARRAY(SELECT -mod(i + j, 30) / 10.0 FROM generate_series(1, 64) AS j)::real[], 'stop'
            FROM generate_series(1, %s) AS i""", (calls,))
        db.execute("INSERT INTO rewards (rollout_id, kind, value, created_at) VALUES (%s, 'final', 1.0, now())", (BIG,))
        db.execute("ANALYZE")
    return time.perf_counter() - started


def timed(browser, url: str, ready, repeat: int, before=None) -> float:
    times = []
    for _ in range(repeat):
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        if before:
            before(page)
        started = time.perf_counter()
        page.goto(url)
        ready(page)
        times.append(time.perf_counter() - started)
        page.close()
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rollouts", type=int, default=100_000)
    parser.add_argument("--calls", type=int, default=5_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "ui.txt"), help="'-': stdout only")
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        sys.exit("no chromium here (scripts/install.sh installs Debian's)")
    server = os.environ.get("RLPROXY_TEST_POSTGRES") or "postgresql://postgres@127.0.0.1:5432/postgres"
    run_dir = Path(os.environ.get("TMPDIR", "/tmp")) / f"ui-bench-{os.getpid()}"
    run_dir.mkdir(parents=True, exist_ok=True)
    lines = []
    with fresh_database(server, "rlproxy_ui_bench") as database_url:
        filled = fill(database_url, args.rollouts, args.calls)
        port = free_port()
        stub = f"http://127.0.0.1:{port}"
        with running(stub_command(port), stub + "/health", log_path=run_dir / "stub.log"), \
                running_proxy([stub], database_url, run_dir) as proxy, sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
            # the list counts up to store.browse.TOTAL_CAP, then says "more than"
            total = (f"{args.rollouts + 1} rollouts; page 1" if args.rollouts + 1 <= TOTAL_CAP
                     else f"more than {TOTAL_CAP} rollouts; page 1")
            pages = {
                "rollout list, first page": timed(browser, f"{proxy}/ui/#/rollouts",
                                                  lambda page: page.get_by_text(total).wait_for(), args.repeat),
                "list filtered (agent, reward >= 0.5), by reward": timed(
                    browser, f"{proxy}/ui/#/rollouts?agent=agent-2&reward_min=0.5&sort=reward_high",
                    lambda page: page.get_by_text("rollouts; page 1").wait_for(), args.repeat),
            }

            walk = max(1, min(99, args.rollouts // 50 - 1))

            def hundredth(page):
                page.get_by_text(total).wait_for()
                for n in range(2, walk + 2):
                    page.get_by_role("button", name="Next page").click()
                    page.get_by_text(f"rollouts; page {n}").wait_for()

            started = time.perf_counter()
            page = browser.new_page()
            page.goto(f"{proxy}/ui/#/rollouts?live=off")
            hundredth(page)
            per_page = (time.perf_counter() - started) / (walk + 1)
            page.close()
            pages[f"rollout list, each of the next {walk} pages (cursor)"] = per_page
            pages[f"rollout of {args.calls} calls (summary + first 20 calls)"] = timed(
                browser, f"{proxy}/ui/#/rollout/{BIG}",
                lambda page: page.get_by_role("region", name="call 20").wait_for(), args.repeat)
            browser.close()
    lines.append(f"## {time.strftime('%Y-%m-%d')} {cpu_model()}, {os.cpu_count()} cores: bench/ui_load.py --rollouts {args.rollouts} "
                 f"--calls {args.calls} --repeat {args.repeat}")
    lines.append(f"filled in {filled:.1f} s (Postgres generate_series); headless Chromium, `rlproxy serve` on Postgres")
    for name, seconds in pages.items():
        lines.append(f"{name:<58}{seconds * 1000:>8.0f} ms")
    text = "\n".join(lines)
    print(text)
    if args.out != "-":
        with open(args.out, "a") as f:
            f.write(text + "\n\n")


if __name__ == "__main__":
    main()
