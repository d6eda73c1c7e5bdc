"""`rlproxy demo`, short, end to end on the embedded default (SQLite) against the real engine: episodes are
recorded, the base model is measured, the trainer produces at least one adapter version, which serves at once
and is measured by held-out probes (default) or is evaluated on the held-out set before it may serve."""
from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
import time

import pytest

from tests.support import free_port

pytestmark = pytest.mark.engine


def demo_command(engine_url, tmp_path, minutes: float, *extra: str) -> list[str]:
    """A small `rlproxy demo` on the shared engine, its SQLite store and state in `tmp_path`."""
    return [sys.executable, "-m", "rlproxy.cli", "demo", "--upstream", engine_url, "--minutes", str(minutes),
            "--headless", "--heldout", "8", "--concurrency", "4", "--port", str(free_port()),
            "--workdir", str(tmp_path), "--database-url", f"sqlite+aiosqlite:///{tmp_path / 'rlproxy.db'}",
            "--set", "batch_rollouts=4", "--set", "group_size=4", "--set", "group_timeout_s=15", *extra]


def run_demo(engine_url, tmp_path, *extra: str) -> tuple[subprocess.CompletedProcess, str]:
    database = tmp_path / "rlproxy.db"
    done = subprocess.run(demo_command(engine_url, tmp_path, 3, *extra), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    state = json.loads((tmp_path / "rlproxy-demo.json").read_text())
    assert "0" in state["heldout"]  # the base model was measured on the held-out split
    assert (tmp_path / "rlproxy-reward-curve.png").stat().st_size > 10_000
    assert "held-out success" in done.stdout
    return done, str(database)


def test_a_short_demo_with_the_heldout_gate_evaluates_every_candidate(engine_url, tmp_path):
    _, database = run_demo(engine_url, tmp_path, "--gate", "heldout")
    with sqlite3.connect(database) as db:
        versions = db.execute("SELECT version, status, evaluation FROM policies ORDER BY version").fetchall()
        probes = db.execute("SELECT count(*) FROM rollouts WHERE agent = 'demo-heldout'").fetchone()[0]
    assert probes == 0
    assert versions, "no adapter version was produced"
    *gated, last = versions
    for version, status, evaluation in gated:  # scored by the command gate on the gate split, never held-out
        verdict = json.loads(evaluation)["command_gate"]
        assert status in ("active", "retired") and (verdict["n"], verdict["set"]) == (8, "gate")
        assert verdict["promoted"] or status == "retired"
    # the deadline may interrupt the last candidate's evaluation: it then waits, ungated, for the next run
    assert last[1] in ("active", "retired", "candidate")
    if last[1] != "candidate":
        assert json.loads(last[2])["command_gate"]["n"] == 8


def assert_a_probed_demo_trained_served_and_measured(database: str, stdout: str) -> None:
    """What a demo run with held-out probes leaves behind: recorded episodes with their token ids, trained
    rollouts (never the probes), probes marked as evaluation traffic, and versions that served at once."""
    with sqlite3.connect(database) as db:
        by_agent = dict(db.execute("SELECT agent, count(*) FROM rollouts WHERE status = 'finished' GROUP BY agent"))
        with_ids = db.execute("SELECT count(*) FROM calls WHERE prompt_token_ids IS NOT NULL "
                              "AND rollout_id IS NOT NULL").fetchone()[0]
        trained = dict(db.execute("SELECT agent, count(*) FROM rollouts WHERE trained_at IS NOT NULL GROUP BY agent"))
        evaluation = dict(db.execute("SELECT agent, min(eval) FROM rollouts GROUP BY agent"))
        versions = db.execute("SELECT version, status FROM policies ORDER BY version").fetchall()
    assert by_agent.get("demo", 0) >= 4 and by_agent.get("demo-heldout", 0) >= 1, by_agent
    assert with_ids >= sum(by_agent.values())
    assert trained.get("demo", 0) >= 4
    assert "demo-heldout" not in trained  # probes measure; they are never training data
    assert evaluation == {"demo": 0, "demo-heldout": 1}  # probes are evaluation traffic, as a user marks it
    assert versions, "no adapter version was produced"
    # with probes, a new version serves at once (the stop may come before the last one is published)
    assert all(status in ("active", "retired") for _, status in versions[:-1])
    assert versions[-1][1] in ("active", "candidate")
    assert len(versions) >= 2 or versions[0][1] == "active"
    assert "episodes" in stdout and "95% interval" in stdout and "held-out success" in stdout


def test_a_demo_with_probes_trains_and_serves_then_ctrl_c_stops_it_cleanly_and_the_next_run_resumes(
        engine_url, tmp_path):
    """One demo start serves two checks: what a run with held-out probes records and serves (stopped by
    Ctrl-C once a version serves, as a user stops it), and that the next run resumes from what it made."""
    database = tmp_path / "rlproxy.db"

    def policies() -> list[tuple[int, str]]:
        if not database.exists():
            return []
        with sqlite3.connect(database, timeout=10) as db:
            try:
                return db.execute("SELECT version, status FROM policies ORDER BY version").fetchall()
            except sqlite3.OperationalError:  # not migrated yet
                return []

    out_path, err_path = tmp_path / "first.out", tmp_path / "first.err"
    with open(out_path, "w") as out, open(err_path, "w") as err:  # files, not pipes: nobody reads them meanwhile
        first = subprocess.Popen(demo_command(engine_url, tmp_path, 10, "--probe-share", "0.5"),
                                 stdout=out, stderr=err)
    try:
        deadline = time.monotonic() + 420
        while not any(status == "active" for _, status in policies()):
            assert first.poll() is None and time.monotonic() < deadline, "no version served before Ctrl-C"
            time.sleep(2)
        first.send_signal(signal.SIGINT)
        first.wait(timeout=240)
    finally:
        if first.poll() is None:
            first.kill()
    out, err = out_path.read_text(), err_path.read_text()
    assert first.returncode == 0, err[-3000:]
    assert "stopping:" in err and "held-out success" in out  # it said why it waited, then summed up
    state = json.loads((tmp_path / "rlproxy-demo.json").read_text())
    assert "0" in state["heldout"]  # the base model was measured on the held-out split
    assert (tmp_path / "rlproxy-reward-curve.png").stat().st_size > 10_000
    assert_a_probed_demo_trained_served_and_measured(str(database), out)
    before = policies()
    [active] = [version for version, status in before if status == "active"]
    with sqlite3.connect(database) as db:
        earlier = {id_ for (id_,) in db.execute("SELECT id FROM rollouts")}
        trained_before = dict(db.execute("SELECT id, trained_at FROM rollouts WHERE trained_at IS NOT NULL"))

    second = subprocess.run(demo_command(engine_url, tmp_path, 1), capture_output=True, text=True, timeout=400)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "measuring the base model" not in second.stderr  # the base measurement was kept
    with sqlite3.connect(database) as db:
        served = [(rollout, version) for rollout, version in db.execute(
            "SELECT rollout_id, policy_version FROM calls WHERE rollout_id IS NOT NULL ORDER BY rowid")
            if rollout not in earlier]
        trained_after = dict(db.execute("SELECT id, trained_at FROM rollouts WHERE trained_at IS NOT NULL"))
    assert served and min(version for _, version in served) == active  # it went on from the version it had made
    assert all(trained_after[id_] == at for id_, at in trained_before.items())  # nothing trained twice
    assert [v for v, _ in policies()][:len(before)] == [v for v, _ in before]
