"""What every config group's schema shares: the error a config that cannot run raises."""

from __future__ import annotations


class ConfigError(ValueError):
    """A config that cannot run; the message names the key and what is allowed."""
