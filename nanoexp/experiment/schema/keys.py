"""The Hydra key of each engine knob: which group holds each section of the engine's config, the key of every
`LLM(...)` keyword (`kv_block_size` -> `cache.block_size`), and engine messages, which name keywords,
phrased with those keys (run.py's error line and its logs). The one place where the two spellings meet."""

from __future__ import annotations

import re

from nanoexp.config import KnobError
from nanoexp.config.engine import KEYWORDS, keyword_of

# the group holding each section of the engine's EngineConfig: its knobs are `<group>.<field>`
GROUP_OF_SECTION = {
    "model": "model",
    "cache": "cache",
    "scheduler": "scheduler",
    "parallel": "parallel",
    "execution": "engine",
}
# every keyword -> the key run.py's users type for the same knob (the Hydra config's dotted key)
HYDRA_KEYS = {keyword: f"{GROUP_OF_SECTION[s]}.{n}" for keyword, (s, n) in KEYWORDS.items()}


def _keyword_pattern() -> re.Pattern:
    """A keyword as a message names a knob: `keyword=...`, or bare where it cannot be a plain word (it has
    an underscore); never inside a dotted key (`engine.device`) or another identifier."""
    names = sorted(HYDRA_KEYS, key=len, reverse=True)
    bare = "|".join(re.escape(k) for k in names if "_" in k)
    assigned = "|".join(re.escape(k) for k in names)
    return re.compile(rf"(?<![\w./=-])(?:(?:{assigned})(?=\s*=)|(?:{bare})(?![\w]))")


KEYWORD_PATTERN = _keyword_pattern()


def in_hydra_keys(message: str) -> str:
    """An engine message (phrased with `LLM(**kwargs)`'s keywords) phrased with the Hydra keys run.py's
    users type: `num_kv_blocks` -> `cache.num_blocks`, `device='cuda'` -> `engine.device='cuda'`.
    run.py's error path applies it to every error line, its job logging to the engine's log lines."""
    return KEYWORD_PATTERN.sub(lambda m: HYDRA_KEYS[m.group(0)], message)


def as_hydra_key(e: KnobError) -> KnobError:
    """An engine config class's error (naming the knob as the engine does) naming its Hydra key."""
    keyword = keyword_of(e.knob)
    return KnobError(HYDRA_KEYS.get(keyword, e.knob), e.value, e.allowed, e.reason)
