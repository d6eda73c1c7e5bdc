"""`rlproxy demo`, short, end to end on the embedded default (SQLite) against the real engine: episodes are
recorded, the base model is measured, the trainer produces at least one adapter version, which serves at once
and is measured by held-out probes (default) or is evaluated on the gate split before it may serve
(`--gate heldout`). One demo start serves every check: a run with probes, stopped by Ctrl-C, then the next run
resuming it with the held-out gate; both run without a terminal (output to files and pipes, as under CI)."""
from __future__ import annotations

import json
import re
import signal
import sqlite3
import subprocess
import sys
import time

import pytest

from demo.view import PANEL_TITLE
from tests.support import free_port

pytestmark = pytest.mark.engine


def demo_command(engine_url, tmp_path, minutes: float, *extra: str) -> list[str]:
    """A small `rlproxy demo` on the shared engine, its SQLite store and state in `tmp_path`."""
    return [sys.executable, "-m", "rlproxy.cli", "demo", "--upstream", engine_url, "--minutes", str(minutes),
            "--headless", "--heldout", "8", "--concurrency", "4", "--port", str(free_port()),
            "--workdir", str(tmp_path), "--database-url", f"sqlite+aiosqlite:///{tmp_path / 'rlproxy.db'}",
            "--set", "batch_rollouts=4", "--set", "group_size=4", "--set", "group_timeout_s=15", *extra]


def progress_lines_without_a_terminal(stdout: str, stderr: str, workdir) -> list[str]:
    """What a run with no terminal says: where its logs are, then time-stamped progress lines and nothing else
    (no panel, no escape codes, no log line; a warning that matters is one line naming the log), the summary on
    stdout. Returns what the progress lines said."""
    lines = stderr.splitlines()
    log = f"(details: {workdir / 'rlproxy.log'})"
    assert lines[0] == f"logs: {workdir / 'rlproxy.log'}"
    progress = [line for line in lines[1:] if not line.endswith(log)]
    assert all(re.match(r"\[\d+:\d\d\] \S", line) for line in progress), lines  # time-stamped, nothing else
    said = [line.split("] ", 1)[1] for line in progress]
    assert said[0] == "preparing the model"
    assert any(line.startswith("agents running") for line in said)
    assert PANEL_TITLE not in stdout + stderr and "\x1b[" not in stdout + stderr
    assert "held-out success by policy version" in stdout and "reward curve: " in stdout
    assert "/ui/" in stdout  # where to look at each episode (docs/ui.md)
    return said


def assert_every_candidate_was_gated(database: str, after_version: int, said: list[str]) -> None:
    """With --gate heldout: each version made after `after_version` was scored by the command gate on the gate
    split (never the held-out tasks) before it could serve, and no probe ran."""
    with sqlite3.connect(database) as db:
        versions = db.execute("SELECT version, status FROM policies WHERE version > ? "
                              "ORDER BY version", (after_version,)).fetchall()
        verdicts = {version: (json.loads(evidence), promoted) for version, evidence, promoted in db.execute(
            "SELECT version, evidence, promoted FROM policy_verdicts WHERE kind = 'command_gate' "
            "AND promoted IS NOT NULL AND version > ? ORDER BY id", (after_version,))}
    assert versions, "no adapter version was produced"
    first = f"scoring candidate v{versions[0][0]} on 8 tasks of the gate split"
    assert any(line.startswith(first) for line in said), said
    *gated, last = versions
    for version, status in gated:  # scored by the command gate on the gate split, never held-out
        evidence, promoted = verdicts[version]
        assert status in ("active", "retired") and (evidence["n"], evidence["set"]) == (8, "gate")
        assert promoted or status == "retired"
    # the deadline may interrupt the last candidate's evaluation: it then waits, ungated, for the next run
    assert last[1] in ("active", "retired", "candidate")
    if last[1] != "candidate":
        assert verdicts[last[0]][0]["n"] == 8


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


def test_a_demo_with_probes_trains_and_serves_then_ctrl_c_stops_it_and_the_next_run_resumes_behind_the_gate(
        engine_url, tmp_path):
    """What a run with held-out probes records and serves (stopped by Ctrl-C once a version serves, as a user
    stops it); then the next run, with the held-out gate, resumes from what the first made and gates each new
    candidate."""
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
    said = progress_lines_without_a_terminal(out, err, tmp_path)
    assert "measuring the base model on 8 held-out tasks" in said
    state = json.loads((tmp_path / "rlproxy-demo.json").read_text())
    assert "0" in state["heldout"]  # the base model was measured on the held-out split
    assert (tmp_path / "rlproxy-reward-curve.png").stat().st_size > 10_000
    assert_a_probed_demo_trained_served_and_measured(str(database), out)
    before = policies()
    [active] = [version for version, status in before if status == "active"]
    with sqlite3.connect(database) as db:
        earlier = {id_ for (id_,) in db.execute("SELECT id FROM rollouts")}
        trained_before = dict(db.execute("SELECT id, trained_at FROM rollouts WHERE trained_at IS NOT NULL"))

    second = subprocess.run(demo_command(engine_url, tmp_path, 1.5, "--gate", "heldout"), capture_output=True,
                            text=True, timeout=420)
    assert second.returncode == 0, second.stderr[-3000:]
    said = progress_lines_without_a_terminal(second.stdout, second.stderr, tmp_path)
    assert "time is up: finishing the episodes in flight" in said  # it ran to its deadline
    assert "measuring the base model" not in second.stderr  # the base measurement was kept
    assert_every_candidate_was_gated(str(database), max(version for version, _ in before), said)
    with sqlite3.connect(database) as db:
        served = [(rollout, version) for rollout, version in db.execute(
            "SELECT rollout_id, policy_version FROM calls WHERE rollout_id IS NOT NULL ORDER BY rowid")
            if rollout not in earlier]
        trained_after = dict(db.execute("SELECT id, trained_at FROM rollouts WHERE trained_at IS NOT NULL"))
    assert served and min(version for _, version in served) == active  # it went on from the version it had made
    assert all(trained_after[id_] == at for id_, at in trained_before.items())  # nothing trained twice
    assert [v for v, _ in policies()][:len(before)] == [v for v, _ in before]
    with sqlite3.connect(database) as db:  # behind the gate no probe runs: the gate split measures candidates
        probes = {id_ for (id_,) in db.execute("SELECT id FROM rollouts WHERE agent = 'demo-heldout'")}
    assert probes <= earlier
