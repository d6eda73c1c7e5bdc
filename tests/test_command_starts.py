"""What `rlproxy serve` and `rlproxy train` say when they cannot start as asked: one line naming what to do,
before anything starts, never a traceback. Each case is a mistake a new user made: an engine URL copied with its
`/v1`, a port already taken, a trainer started before anything migrated the database, a second trainer, a rank
other than the adapters' own. Run as users run them: the real CLI, in a process of its own where it binds."""
from __future__ import annotations

import socket
import subprocess

import pytest
from click.testing import CliRunner

from rlproxy.cli import main
from testkit.processes import create_database, drop_database, rlproxy_command


def one_line_error(result: subprocess.CompletedProcess) -> str:
    """The error a command ended with: its only line on stderr, no traceback."""
    assert result.returncode == 1, (result.stdout, result.stderr)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert "Traceback" not in result.stderr and len(lines) == 1, result.stderr
    return lines[0]


@pytest.mark.parametrize("command", [["serve"], ["train"], ["demo"], ["eval", "--policy", "v1"]])
def test_an_engine_url_ending_in_v1_is_refused_naming_the_url_to_give(command):
    """rlproxy adds `/v1/...` itself: an engine URL with `/v1` made every agent's call a 404 (`/v1/v1/...`)."""
    result = CliRunner().invoke(main, [*command, "--upstream", "http://127.0.0.1:8177/v1/"])
    assert result.exit_code == 2  # a usage error, like any refused flag
    assert "--upstream" in result.output and "without /v1 (like http://127.0.0.1:8177)" in result.output


def test_an_engine_url_without_a_scheme_is_refused():
    result = CliRunner().invoke(main, ["serve", "--upstream", "127.0.0.1:8177"])
    assert result.exit_code == 2 and "is not an engine URL" in result.output


def test_a_taken_port_is_one_line_said_before_anything_starts(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(rlproxy_command("serve", "--upstream", "http://127.0.0.1:9", "--port", str(port),
                                                "--database-url", f"sqlite+aiosqlite:///{tmp_path}/rlproxy.db",
                                                "--spool-path", str(tmp_path / "spool.jsonl")),
                                capture_output=True, text=True, timeout=120)
    assert one_line_error(result) == (f"Error: 127.0.0.1:{port} is taken (another process listens there): stop it "
                                      "or give --port another one")
    assert not (tmp_path / "rlproxy.db").exists()  # nothing started: no database made, no spool claimed


def trainer(database_url: str, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run(rlproxy_command("train", "--upstream", "http://127.0.0.1:9", "--database-url",
                                          database_url, *flags), capture_output=True, text=True, timeout=300)


def test_a_trainer_on_a_database_nothing_migrated_says_to_migrate(postgres_server):
    database_url = create_database(postgres_server, "rlproxy_test", migrate=False)
    try:
        said = one_line_error(trainer(database_url, "--metrics-port", "0"))
    finally:
        drop_database(postgres_server, database_url)
    assert "has no rlproxy schema yet: run `rlproxy migrate` with this --database-url first" in said


def test_a_second_trainer_on_the_same_metrics_port_is_told_why_it_cannot_start(own_database_url):
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        said = one_line_error(trainer(own_database_url, "--metrics-port", str(taken.getsockname()[1])))
    assert "is another trainer running there? One trainer per database" in said


def test_an_adapter_made_with_another_rank_is_refused_naming_both(tiny_model, tmp_path):
    """`rlproxy train --lora-rank 16` going on from adapters trained at rank 8."""
    from core.settings import TrainingSettings
    from trainer.adapter import AdapterMismatch
    from trainer.ppo import PolicyTrainer

    saved = PolicyTrainer(tiny_model, TrainingSettings(lora_rank=8)).save_adapter(tmp_path / "v1")
    with pytest.raises(AdapterMismatch, match=r"has r=8 and the trainer's settings make 16: train on with the "
                                              r"settings it was made with, or start a new line"):
        PolicyTrainer(tiny_model, TrainingSettings(lora_rank=16), adapter_dir=saved)
