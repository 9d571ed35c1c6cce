"""ConfigError, in a module of its own so that the config's checks (config_checks.py), which
config.py calls, can raise it without importing config.py. ``fastcrit.config.ConfigError`` is the
same class."""


class ConfigError(ValueError):
    """A config, a data file's settings or a run's options that cannot work; the message names the
    key (or file) and what was wrong."""
