"""Every setting of `rlproxy serve`, `engine`, `train` and `demo` comes from one settings model: its flag, its
`RLPROXY_*` variable and its documented default cannot disagree, and a value the model refuses is a usage
error that names the flag. Run as a user runs them: the real CLI, in a process where it matters."""
from __future__ import annotations

import dataclasses
import re
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from core.settings import EngineSettings, ProxySettings, TrainerSettings
from demo.settings import DemoSettings
from rlproxy.cli import main
from rlproxy.commands import serve as serve_command
from rlproxy.commands.flags import env_name, settings_of
from rlproxy.commands.settings_doc import markdown
from rlproxy.commands.train import train_config_from
from runner.settings import RunSettings
from testkit.processes import rlproxy_command
from trainer.config import TrainConfig

ROOT = Path(__file__).resolve().parent.parent


def test_the_settings_page_is_what_the_models_say():
    """docs/settings.md is generated; regenerate it with `python -m rlproxy.commands.settings_doc`."""
    assert (ROOT / "docs/settings.md").read_text() == markdown()


@pytest.mark.parametrize("command, models", [
    ("serve", [ProxySettings]), ("engine", [EngineSettings]), ("train", [TrainerSettings, TrainConfig]),
    ("run", [RunSettings])])
def test_every_field_of_a_commands_models_is_one_flag_in_its_help(command, models):
    help_text = CliRunner().invoke(main, [command, "--help"], terminal_width=200).output
    for model in models:
        for setting in settings_of(model):
            assert len(re.findall(rf"^\s+--{setting.flag}[ /]", help_text, re.MULTILINE)) == 1, setting
            assert env_name(setting.flag) in help_text


def test_flags_and_environment_reach_the_proxys_settings(monkeypatch):
    """Settings that once had no flag (the writer's queue, AIR and its weights) are set like any other."""
    served = []
    monkeypatch.setattr("proxy.app.run", served.append)  # the server itself is not what is tested here
    result = CliRunner().invoke(main, [
        "serve", "--upstream", "http://127.0.0.1:9,http://127.0.0.1:10", "--writer-batch-size", "32",
        "--no-air", "--air-tool-error", "-1", "--auth", "off", "--air-error-patterns", "boom, and more"],
        env={"RLPROXY_WRITER_QUEUE_SIZE": "77", "RLPROXY_WRITER_FLUSH_INTERVAL": "0.5",
             "RLPROXY_DURABILITY": "sync"})
    assert result.exit_code == 0, result.output
    [settings] = served
    assert settings.upstreams == ("http://127.0.0.1:9", "http://127.0.0.1:10")
    assert (settings.writer.queue_size, settings.writer.batch_size, settings.writer.flush_interval) == (77, 32, 0.5)
    assert settings.writer.durability == "sync" and settings.auth.mode == "off"
    assert settings.air is False and settings.air_tool_error == -1.0
    assert settings.air_error_patterns == ("boom, and more",)  # a regex keeps its commas
    assert serve_command.SERVE_FLAGS.build(ProxySettings, {}) == ProxySettings()  # nothing given: the defaults


def test_training_settings_are_flags_environment_variables_or_set_pairs():
    config = train_config_from(["learning_rate=5e-4", "train_agents=planner, coder", "bf16=false",
                                "group-size=4", "credit=discounted"])
    assert config == dataclasses.replace(TrainConfig(), learning_rate=5e-4, train_agents=["planner", "coder"],
                                         bf16=False, group_size=4, credit="discounted")
    with pytest.raises(Exception, match="not a setting"):
        train_config_from(["learning_rat=1"])


def test_a_value_the_model_refuses_is_a_usage_error_naming_the_flag():
    bad_proxy = subprocess.run(rlproxy_command("serve", "--upstream", "http://127.0.0.1:9", "--writer-batch-size",
                                               "0"), capture_output=True, text=True, timeout=120)
    assert bad_proxy.returncode == 2 and "--writer-batch-size" in bad_proxy.stderr, bad_proxy.stderr
    bad_training = subprocess.run(rlproxy_command("train", "--upstream", "http://127.0.0.1:9"), capture_output=True,
                                  text=True, timeout=120, env={**_environment(), "RLPROXY_LEARNING_RATE": "-1"})
    assert bad_training.returncode == 2 and "learning_rate=-1.0" in bad_training.stderr, bad_training.stderr
    bad_choice = subprocess.run(rlproxy_command("train", "--upstream", "http://127.0.0.1:9", "--credit", "all"),
                                capture_output=True, text=True, timeout=120)
    assert bad_choice.returncode == 2 and "'all' is not one of 'identical', 'discounted'" in bad_choice.stderr


def test_the_demo_offers_the_trainers_settings_with_its_own_defaults():
    help_text = CliRunner().invoke(main, ["demo", "--help"], terminal_width=200).output
    assert "--group-timeout-s FLOAT" in help_text and "default: 60.0" in help_text
    assert re.search(r"--train-agents TEXT .*default: \(?demo\)?]", help_text)


def _environment() -> dict[str, str]:
    import os

    return dict(os.environ)


def test_the_demos_task_seed_and_the_trainers_seed_are_two_settings():
    from rlproxy.commands.demo import DEMO_FLAGS

    params: dict = {}
    DEMO_FLAGS.apply_set(params, ["seed=3", "task_seed=5"])
    assert DEMO_FLAGS.build(TrainConfig, params).seed == 3
    assert DEMO_FLAGS.build(DemoSettings, params, train=TrainConfig()).task_seed == 5
