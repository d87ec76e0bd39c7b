"""Deprecated spellings of knobs, accepted for one release: each is renamed to its new spelling with a
one-line warning. The one table of renames, for `LLM(**kwargs)`'s keywords and for run.py's Hydra keys
(docs/internals.md's glossary says why each name was chosen)."""

from __future__ import annotations

import logging
from collections.abc import MutableMapping
from typing import Any

# LLM(model, **kwargs): old keyword -> new keyword
KEYWORDS = {
    "kvcache_block_size": "kv_block_size",  # nano-vLLM's spelling; every other KV name is kv_*
    "num_kvcache_blocks": "num_kv_blocks",
    "cpu_kv_cache_gb": "cpu_kv_cache_gib",  # it always meant GiB
}
# run.py: old dotted key -> new dotted key (in the same group). The schema keeps a field for each old key
# (default None) so that Hydra composes it; `rename_keys` moves its value before the config is typed.
HYDRA_KEYS = {
    "cache.cpu_kv_cache_gb": "cache.cpu_kv_cache_gib",
}

log = logging.getLogger("nanoexp")


def deprecated(old: str, new: str) -> None:
    """The one-line warning for a deprecated spelling."""
    log.warning("nanoexp: warning: %s is deprecated; use %s", old, new)


def rename_keywords(kwargs: dict[str, Any]) -> dict[str, Any]:
    """`kwargs` with each deprecated keyword renamed (with its warning); both spellings is an error."""
    out = dict(kwargs)
    for old, new in KEYWORDS.items():
        if old in out:
            if new in out:
                raise TypeError(f"{old} and {new} are one argument; pass only {new}")
            deprecated(old, new)
            out[new] = out.pop(old)
    return out


def rename_keys(config: MutableMapping[str, Any]) -> None:
    """In a composed config (nested mappings: a Hydra DictConfig or plain dicts), moves each deprecated key's
    value, where set, to its new key (which always has a value: its default) and clears the old key."""
    for old, new in HYDRA_KEYS.items():
        *path, old_leaf = old.split(".")
        new_leaf = new.rsplit(".", 1)[-1]
        node: Any = config
        for part in path:
            node = node.get(part) if isinstance(node, MutableMapping) else None
        if not isinstance(node, MutableMapping) or node.get(old_leaf) is None:
            continue
        deprecated(old, new)
        node[new_leaf] = node[old_leaf]
        node[old_leaf] = None
