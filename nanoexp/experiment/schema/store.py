"""Registers the schema with Hydra, in one place: the root schema (conf/config.yaml lists it first) in the
ConfigStore, and the resolvers of hydra.sweep.subdir."""

from __future__ import annotations

from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

from nanoexp.experiment.schema.experiment import NanoexpConfig
from nanoexp.experiment.schema.job_dirs import job_number, safe_dir_name


def register() -> None:
    ConfigStore.instance().store(name="nanoexp_schema", node=NanoexpConfig)
    OmegaConf.register_new_resolver("nanoexp_dir_name", safe_dir_name, replace=True)
    OmegaConf.register_new_resolver("nanoexp_job_num", lambda num: job_number(num), replace=True)
