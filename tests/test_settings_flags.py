"""Every setting of `rlproxy serve`, `engine`, `train`, `demo`, `run` and `eval` comes from one settings model
per command (core/settings/): its flag, its `RLPROXY_*` variable and its documented default cannot disagree;
a flag wins over its variable, which wins over the default (and `--set NAME=VALUE` over the flag); a value the
model refuses is a usage error that names the flag. Run as a user runs them: the real CLI, in a process where
it matters."""
from __future__ import annotations

import dataclasses
import os
import re
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from core.settings import DemoSettings, EngineSettings, ProxySettings, Pruning, TrainingSettings
from core.settings.redaction import Redaction
from rlproxy.cli import main
from rlproxy.commands.settings_doc import SECTIONS, markdown
from rlproxy.commands.train import training_from
from testkit.processes import rlproxy_command

ROOT = Path(__file__).resolve().parent.parent
COMMANDS = [(title.split(" (")[0].removeprefix("rlproxy "), flags) for flags, title in SECTIONS]


def command_of(name: str):
    """The click command `rlproxy <name>` runs ("keys create": a group's command)."""
    command = main
    for word in name.split():
        command = command.get_command(None, word)
    return command


def test_the_settings_page_is_what_the_models_say():
    """docs/settings.md is generated; regenerate it with `python -m rlproxy.commands.settings_doc`."""
    assert (ROOT / "docs/settings.md").read_text() == markdown()


@pytest.mark.parametrize("command, flags", COMMANDS, ids=[name for name, _ in COMMANDS])
def test_every_setting_of_a_command_is_one_flag_in_its_help_and_one_row_of_the_page(command, flags):
    help_text = CliRunner().invoke(main, [*command.split(), "--help"], terminal_width=200).output
    section = markdown().split(f"### rlproxy {command}")[1].split("### ")[0]
    for setting in flags.settings:
        assert len(re.findall(rf"^\s+--{setting.flag}[ /,]", help_text, re.MULTILINE)) == 1, setting
        assert setting.env in help_text
        assert section.count(f"| `--{setting.flag}` | `{setting.env}` |") == 1, setting


def test_train_config_lists_every_training_setting_once():
    listed = CliRunner().invoke(main, ["train-config"]).output
    names = re.findall(r"^(\w+) = ", listed, re.MULTILINE)
    assert names == [field.name for field in dataclasses.fields(TrainingSettings)]
    assert "learning_rate = 0.001  (--learning-rate, RLPROXY_LEARNING_RATE)" in listed


def built(command: str, args: list[str], environment: dict[str, str], monkeypatch):
    """The settings `rlproxy <command> <args>` runs with, in this environment (as the command builds them)."""
    flags = dict(COMMANDS)[command]
    for setting in flags.settings:
        for variable in setting.envs:
            monkeypatch.delenv(variable, raising=False)
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    with command_of(command).make_context(command, args) as context:
        return flags.build(context.params, context.params.get("pairs", ()))


def test_a_flag_wins_over_its_variable_which_wins_over_the_default(monkeypatch):
    settings = built("train", ["--upstream", "http://engine:8000", "--group-size", "6", "--mini-batches", "2",
                               "--set", "mini_batches=3", "--eval-agents", "grader,probe"],
                     {"RLPROXY_GROUP_SIZE": "4", "RLPROXY_LEARNING_RATE": "5e-4",
                      "RLPROXY_TRAIN_AGENTS": "planner coder", "RLPROXY_UPSTREAM": "http://other:8000",
                      "RLPROXY_WORKER_ID": "from-env"}, monkeypatch)
    training = settings.training
    assert training.group_size == 6  # the flag, not RLPROXY_GROUP_SIZE
    assert training.mini_batches == 3  # --set wins over the flag
    assert training.learning_rate == 5e-4 and settings.worker_id == "from-env"  # variables, no flag given
    assert training.lora_rank == 8 and settings.poll_interval == 1.0  # neither: the defaults
    assert training.train_agents == ["planner", "coder"] and training.eval_agents == ["grader", "probe"]
    assert settings.upstreams == ("http://engine:8000",)


def test_flags_and_environment_reach_the_proxys_settings(monkeypatch):
    """Settings that once had no flag (the writer's queue, AIR and its weights) are set like any other."""
    served = []
    monkeypatch.setattr("proxy.app.run", served.append)  # the server itself is not what is tested here
    result = CliRunner().invoke(main, [
        "serve", "--upstream", "http://127.0.0.1:9,http://127.0.0.1:10", "--writer-batch-size", "32",
        "--no-air", "--air-tool-error", "-1", "--auth", "off", "--air-error-patterns", "boom, and more"],
        env={"RLPROXY_WRITER_QUEUE_SIZE": "77", "RLPROXY_WRITER_FLUSH_INTERVAL": "0.5",
             "RLPROXY_DURABILITY": "sync", "RLPROXY_AIR": "true", "RLPROXY_ADMIN_KEY": "sk-operator"})
    assert result.exit_code == 0, result.output
    [settings] = served
    assert settings.upstreams == ("http://127.0.0.1:9", "http://127.0.0.1:10")
    assert (settings.writer.queue_size, settings.writer.batch_size, settings.writer.flush_interval) == (77, 32, 0.5)
    assert settings.writer.durability == "sync" and settings.auth.mode == "off"
    assert settings.auth.admin_key.get_secret_value() == "sk-operator"
    assert settings.air is False and settings.air_tool_error == -1.0  # --no-air wins over RLPROXY_AIR
    assert settings.air_error_patterns == ("boom, and more",)  # a regex keeps its commas


def test_settings_built_in_code_read_no_variable(monkeypatch):
    """`rlproxy serve` builds the settings of the engine it starts, the demo those of its engine and proxy:
    the proxy's RLPROXY_PORT must not move them. Only the command line reads the environment."""
    monkeypatch.setenv("RLPROXY_PORT", "9999")
    assert EngineSettings().port == 8000 and ProxySettings().port == 8400 and DemoSettings().proxy_port == 8400
    assert EngineSettings.from_command_line({}).port == 9999
    assert EngineSettings.from_command_line({"port": 8001}).port == 8001


def test_training_settings_from_set_pairs():
    training = training_from(["learning_rate=5e-4", "train_agents=planner, coder", "bf16=false", "group-size=4",
                              "credit=discounted"])
    assert training == dataclasses.replace(TrainingSettings(), learning_rate=5e-4, train_agents=["planner", "coder"],
                                           bf16=False, group_size=4, credit="discounted")
    with pytest.raises(Exception, match="not a setting"):
        training_from(["learning_rat=1"])


def test_a_value_the_model_refuses_is_a_usage_error_naming_the_flag():
    bad_proxy = subprocess.run(rlproxy_command("serve", "--upstream", "http://127.0.0.1:9", "--writer-batch-size",
                                               "0"), capture_output=True, text=True, timeout=120)
    assert bad_proxy.returncode == 2 and "--writer-batch-size=0: Input should be greater than 0" in bad_proxy.stderr
    bad_training = subprocess.run(rlproxy_command("train", "--upstream", "http://127.0.0.1:9"), capture_output=True,
                                  text=True, timeout=120, env={**os.environ, "RLPROXY_LEARNING_RATE": "-1"})
    assert bad_training.returncode == 2, bad_training.stderr
    assert "RLPROXY_LEARNING_RATE (--learning-rate)='-1': Input should be greater than 0" in bad_training.stderr
    bad_choice = subprocess.run(rlproxy_command("train", "--upstream", "http://127.0.0.1:9", "--credit", "all"),
                                capture_output=True, text=True, timeout=120)
    assert bad_choice.returncode == 2 and "'all' is not one of 'identical', 'discounted'" in bad_choice.stderr


def test_pruning_is_one_group_of_settings_that_the_trainer_and_rlproxy_prune_read_alike(monkeypatch):
    """Both take an age as 30d or as seconds; the trainer's old flag and variable (in seconds) still work."""
    day = 86400
    assert built("prune", ["--older-than", "30d"], {}, monkeypatch).pruning.older_than == 30 * day
    assert built("prune", [], {"RLPROXY_OLDER_THAN": "12h"}, monkeypatch).pruning.older_than == day / 2
    upstream = ["--upstream", "http://engine:8000"]
    assert built("train", upstream, {}, monkeypatch).pruning == Pruning(older_than=0)  # off
    assert built("train", [*upstream, "--prune-older-than", "2w"], {}, monkeypatch).pruning.older_than == 14 * day
    assert built("train", [*upstream, "--prune-older-than-s", "90"], {}, monkeypatch).pruning.older_than == 90
    old = built("train", upstream, {"RLPROXY_PRUNE_OLDER_THAN_S": "3600", "RLPROXY_PRUNE_WHAT": "bodies"},
                monkeypatch)
    assert old.pruning == Pruning(older_than=3600, what="bodies")
    both = built("train", upstream, {"RLPROXY_PRUNE_OLDER_THAN_S": "3600", "RLPROXY_PRUNE_OLDER_THAN": "1d"},
                 monkeypatch)
    assert both.pruning.older_than == day  # the new name wins
    monkeypatch.delenv("RLPROXY_OLDER_THAN")
    refused = CliRunner().invoke(main, ["prune", "--database-url", "sqlite+aiosqlite:///unused.db"])
    assert refused.exit_code == 2 and "--older-than (or RLPROXY_OLDER_THAN) is required" in refused.output


def test_redacting_content_is_one_setting_that_the_proxy_and_the_trainer_share(monkeypatch):
    said_once = {"RLPROXY_REDACT_CONTENT": "true"}
    proxy = built("serve", [], said_once, monkeypatch)
    trainer = built("train", ["--upstream", "http://engine:8000"], said_once, monkeypatch)
    assert proxy.redaction == trainer.redaction == Redaction(redact_content=True)


def test_the_demo_offers_the_trainers_settings_with_its_own_defaults(monkeypatch):
    help_text = CliRunner().invoke(main, ["demo", "--help"], terminal_width=200).output
    assert "--group-timeout-s FLOAT" in help_text and "default: 60.0" in help_text
    assert re.search(r"--train-agents TEXT .*default: \(?demo\)?]", help_text)
    settings = built("demo", ["--set", "seed=3", "--task-seed", "5"], {"RLPROXY_GROUP_SIZE": "4"}, monkeypatch)
    assert settings.training.seed == 3 and settings.task_seed == 5  # two settings, not one
    assert settings.training.group_size == 4 and settings.training.group_timeout_s == 60.0  # the demo's default


@pytest.mark.parametrize("settings, words", [
    ({"lora_dropout": 0.1}, "lora_dropout > 0 with proximal_policy=recomputed"),
    ({"policy_loss_type": "gspo"}, "policy_loss_type=gspo with is_correction_level on"),
])
def test_training_settings_that_would_bias_the_ratio_are_refused_with_why(settings, words):
    from core.settings import TrainingSettings

    with pytest.raises(ValueError, match=words):
        TrainingSettings(**settings)
    sound = {"lora_dropout": 0.1, "proximal_policy": "behaviour"} if "lora_dropout" in settings else \
        {"policy_loss_type": "gspo", "is_correction_level": "off"}
    TrainingSettings(**sound)  # each has a form that is sound
