"""`rlproxy eval`: a policy measured with the evidence the gates use (docs/gates.md)."""
from __future__ import annotations

from typing import Literal

from pydantic import Field, SecretStr, field_validator

from core.settings.base import CommandSettings
from core.settings.locations import DEFAULT_DATABASE_URL, DEFAULT_PROXY
from core.settings.urls import engine_url
from core.settings.fields import PLACEHOLDER_KEY
from core.settings.train import EVAL_TIMEOUT, EvalTimeout


class EvalSettings(CommandSettings):
    version: int = Field(ge=0, description="The version to measure, e.g. v3 (v0: the base model).",
                         json_schema_extra={"flag": "policy", "metavar": "vN", "text": True})
    eval_command: str | None = Field(
        None, description="Your evaluation command (as for `train --eval-command`), run for this version; without "
                          "it and without --traffic, the bundled demo task's held-out evaluation runs.",
        json_schema_extra={"flag": "command", "metavar": "COMMAND"})
    split: Literal["heldout", "gate"] = Field(
        "heldout", description="The {split} given to --command: heldout for a report; gate repeats what the gate "
                               "decided on.")
    traffic: bool = Field(
        False, description="Report the evaluation traffic this version served (no engine needed).")
    proxy: str | None = Field(
        None, description=f"Evaluate through this running proxy (default {DEFAULT_PROXY} when --upstream is not "
                          "given).")
    upstream: str | None = Field(
        None, description="Evaluate on this engine directly (base URL, no /v1), loading the adapter if it is not "
                          "loaded.")
    tasks: int = Field(48, ge=1, description="Held-out tasks, one episode each (demo task).")
    seed: int = Field(0, description="Which held-out tasks (the same seed gives the same tasks).")
    concurrency: int = Field(8, ge=1, description="Episodes in flight (demo task).")
    eval_timeout: EvalTimeout = EVAL_TIMEOUT
    api_key: SecretStr | None = Field(None, description="Bearer key sent to the proxy (when its auth is on); none: "
                                                        "the placeholder a proxy without keys takes.")
    database_url: str = Field(DEFAULT_DATABASE_URL, description="SQLAlchemy async database URL.")

    @field_validator("upstream")
    @classmethod
    def _engine_url(cls, url: str | None) -> str | None:
        return None if url is None else engine_url(url)

    @field_validator("version", mode="before")
    @classmethod
    def _version_name(cls, value: object) -> object:
        """`v3`, `V3` or `3`."""
        if isinstance(value, str):
            text = value.strip().lower().removeprefix("v")
            if not text.isdigit():
                raise ValueError(f"{value!r} is not a version like v3")
            return int(text)
        return value

    def key(self) -> str:
        """The key sent to the proxy or engine: the one set, else the placeholder."""
        return self.api_key.get_secret_value() if self.api_key is not None else PLACEHOLDER_KEY
