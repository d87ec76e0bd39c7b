"""The engine's log lines in a job phrased as its error line is, with the Hydra keys run.py's users type."""

from __future__ import annotations

import logging

from nanoexp.experiment.schema.keys import in_hydra_keys


class HydraKeyPhrasing(logging.Filter):
    """The engine's log lines (which name `LLM(...)` keywords) phrased with the Hydra keys, as the error
    line is: `attention_backend=auto: not using triton` -> `engine.attention_backend=auto: ...`."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name.startswith("nanoexp.") and not record.name.startswith("nanoexp.experiment"):
            record.msg, record.args = in_hydra_keys(record.getMessage()), ()
        return True


def phrase_engine_logs() -> None:
    """Puts the phrasing on every handler of the root logger (Hydra's job logging), once."""
    for handler in logging.getLogger().handlers:
        if not any(isinstance(f, HydraKeyPhrasing) for f in handler.filters):
            handler.addFilter(HydraKeyPhrasing())
