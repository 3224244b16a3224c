"""Settings: loaded once from `exporter.yaml` plus `EXPORTER_<SECTION>__<FIELD>` env, then passed down.

`schema` (the root model) and `sections` are the schema only; `load` reads the file and the
environment; `paths` resolves every path marked relative to the config file; `secrets` reads
secrets from the environment or their files; `reference` generates docs/configuration.md.
"""

from .load import load_settings
from .schema import SecretName, Settings
from .sections import LogSettings

__all__ = ["LogSettings", "SecretName", "Settings", "load_settings"]
