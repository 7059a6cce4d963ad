"""Errors a user can act on.

Anything raised as a :class:`UserError` is printed by the command line as one line on stderr
(naming the file, row or key at fault) and ends the process with exit code 2, never a traceback.
"""

from __future__ import annotations


class UserError(Exception):
    """Bad data, config, arguments or a missing model: the message says what and where."""


class ConfigError(UserError):
    """An unknown key, a value of the wrong type or an inconsistent combination of settings."""


class DataError(UserError):
    """A malformed dataset row or file; the message names the file and the row."""


class MissingPackageError(UserError):
    """A configured reward, tool, engine or backend needs a Python package this environment lacks: a
    start-up check (:func:`stepcredit.runtime.require`) raises it before any work, naming the package and
    the pip command. Never turned into a per-row ``error`` result: the whole run stops (exit 2)."""
