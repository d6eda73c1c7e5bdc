"""`rlproxy run`: an agent driven over a task set through a running proxy (runner/, docs/run.md)."""
from __future__ import annotations

from pathlib import Path

from pydantic import Field, SecretStr

from core.settings.base import CommandSettings
from core.settings.locations import DEFAULT_PROXY


class RunSettings(CommandSettings):
    tasks: Path | None = Field(None, description="Task file: JSON lines, one task object a line (or a Parquet "
                                                 "file / `datasets` folder when the datasets package is installed).")
    agent: str | None = Field(None, description="module:function called per attempt as (task, client_config) -> "
                                                "reward or None (sync or async).")
    command: str | None = Field(None, description="Shell command run per attempt with the rollout's URLs in its "
                                                  "environment (docs/run.md).")
    agent_class: str | None = Field(None, description="module:Class, an Agent Lightning v1 agent class run per "
                                                      "attempt in its own process as Class().run().")
    # its choices are runner/harnesses/'s registry, which rlproxy/commands/run.py gives the flag (core is below it)
    harness: str | None = Field(
        None, description="A coding-agent harness run per attempt in a fresh working folder; --verify scores it.")
    prompt_field: str = Field("prompt", description="Task field holding the harness's prompt.")
    verify: str | None = Field(None, description="Shell command run in the harness's working folder afterwards: "
                                                 "its last line if a number, else its exit status (0: 1.0), is "
                                                 "the reward.")
    workdir: Path | None = Field(None, description="Folder copied as each harness attempt's working folder.")
    repo_field: str | None = Field(None, description="Task field naming a git repository cloned as the working "
                                                     "folder instead.")
    harness_args: tuple[str, ...] = Field((), description="One more argument for the harness (repeat).",
                                          json_schema_extra={"split": False})
    env_map: tuple[str, ...] = Field((), description="VAR=field: the task's field given to the agent as the "
                                                     "environment variable VAR (repeat).")
    pass_env: tuple[str, ...] = Field(
        (), description="NAME: a variable of the runner's environment also given to the agent's programs (repeat). "
        "They get only PATH, HOME, USER, LOGNAME, SHELL, LANG, LANGUAGE, LC_*, TZ, TMPDIR, TERM and the rollout's "
        "variables otherwise (docs/run.md).")
    agent_user: str | None = Field(
        None, description="Run the agents' programs (--command, --agent-class, --harness and --verify) as this user "
        "(a name or uid; the runner must be root): they cannot read the task files or the journal (--log), which "
        "the run checks as that user before it starts, nor an earlier attempt's task (docs/run.md).")
    confine_agents: bool = Field(
        True, description="Keep the agents' programs from the journal, the task and key files and one another "
        "(Landlock, Linux 5.13+; docs/run.md, Confinement). --no-confine-agents: trusted agents only.")
    agent_read: tuple[Path, ...] = Field(
        (), description="A folder or file the confined agents may also read (repeat); the journal, task and key "
        "files stay out of reach inside it (docs/run.md, Confinement).")
    agent_write: tuple[Path, ...] = Field(
        (), description="A folder the confined agents may also write, shared by every attempt (repeat).")
    require_confinement: bool = Field(
        False, description="Refuse to run where the agents cannot be confined (no Landlock: Linux before 5.13), "
        "or with a function handed to runner.Runner in Python, which runs inside its caller (an --agent named here "
        "runs in a process of its own, confined).")
    proxy: str = Field(DEFAULT_PROXY, description="The running proxy's URL.")
    api_key: SecretStr | None = Field(None, description="The runner's key to the proxy (when its keys are on): it "
                                                       "creates the rollouts and posts their rewards.")
    agent_api_key: SecretStr | None = Field(
        None, description="The key the agent is given for its calls and rewards: a key of the same project, "
        "without admin rights (default: --api-key).")
    model: str = Field("auto", description='Model name the agent is told to ask for ("auto": the rollout\'s '
                                           "policy).")
    agent_name: str | None = Field(None, description="Agent name of the rollouts (policy rules may route by it).")
    task_id_field: str | None = Field(None, description="Task field holding its id (default: a hash of the task).")
    attempts: int = Field(4, ge=1, description="Attempts per task and epoch: the group the trainer compares.")
    concurrency: int = Field(8, ge=1, description="Attempts in flight at once.")
    epochs: int = Field(1, ge=1, description="Passes over the task set.")
    max_untrained: int = Field(
        0, ge=0, description="Training attempts running or waiting for the trainer at most: a new one starts once "
        "the trainer has consumed earlier ones (0: no limit). Bounds how many versions behind the sampling "
        "policy gets; the trainer's batch_rollouts gives on-policy rounds (docs/run.md, Learning).")
    timeout: float = Field(600.0, gt=0, description="Seconds one attempt may take.")
    retries: int = Field(3, ge=0, description="Times an attempt is tried again after an infrastructure failure "
                                              "(proxy or engine unreachable, 5xx before any answer).")
    eval_share: float = Field(0.0, ge=0, le=1, description="Share of the tasks held out as evaluation rollouts "
                                                            "(chosen by task id, never trained on).")
    eval_tasks: Path | None = Field(None, description="A second task file run as evaluation rollouts only.")
    success_threshold: float = Field(1.0, description="A reward at least this counts as a success.")
    log: Path = Field(Path("rlproxy-run.jsonl"), description="JSON lines log of every attempt (read by --resume).")
    resume: bool = Field(False, description="Skip attempts the log shows rewarded (checked with the proxy).")

    def key(self) -> str | None:
        return self.api_key.get_secret_value() if self.api_key is not None else None

    def agent_key(self) -> str | None:
        """The key the agent gets: its own when one is set, else the runner's (it must be of the rollouts'
        project, or its calls are not theirs)."""
        return self.agent_api_key.get_secret_value() if self.agent_api_key is not None else self.key()
