"""Typed settings, one model per command (one module each), built by the command line from its flags and
`RLPROXY_*` environment variables and passed down. Each model makes its command's flags, its variables and its
section of docs/settings.md: one field, one description, one default, one variable (core/settings/fields.py)."""
from core.settings.base import CommandSettings, Part
from core.settings.demo import DemoSettings
from core.settings.engine import EngineSettings
from core.settings.eval import EvalSettings
from core.settings.fields import ENV_PREFIX, PLACEHOLDER_KEY, Setting, env_name, settings_of
from core.settings.ingest import IngestSettings
from core.settings.locations import DEFAULT_DATABASE_URL, DEFAULT_PROXY, cache_dir
from core.settings.maintenance import (ExportSettings, KeysCreateSettings, KeysListSettings, KeysRevokeSettings,
                                       MigrateSettings, ModelPrepareSettings)
from core.settings.prune import PruneSettings, Pruning
from core.settings.run import RunSettings
from core.settings.serve import AuthSettings, ProxySettings, WriterSettings
from core.settings.train import TrainerSettings
from core.settings.training import TrainingSettings

__all__ = [
    "CommandSettings", "Part", "Setting", "ENV_PREFIX", "PLACEHOLDER_KEY", "env_name", "settings_of", "DEFAULT_DATABASE_URL",
    "DEFAULT_PROXY", "cache_dir", "ProxySettings", "WriterSettings", "AuthSettings", "IngestSettings",
    "EngineSettings", "TrainerSettings", "TrainingSettings", "DemoSettings", "RunSettings", "EvalSettings", "PruneSettings",
    "Pruning", "MigrateSettings", "KeysCreateSettings", "KeysListSettings", "KeysRevokeSettings", "ExportSettings",
    "ModelPrepareSettings",
]
