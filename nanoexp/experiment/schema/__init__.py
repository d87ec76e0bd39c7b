"""The typed Hydra config, a module per config group (conf/<group>/ mirrors it): model, engine, sampler,
workload, logger, profile, metrics, search, capacity, launch, report; the root that composes them
(experiment.py; parallel, cache and scheduler are the engine's classes as they are), the Hydra key of each
engine knob (keys.py), the job dirs' names (job_dirs.py). OmegaConf checks each field's type (bool, int,
enum) as it composes; `__post_init__` checks ranges. Importing the package registers it with Hydra."""

from nanoexp.experiment.schema.capacity import CapacityConfig
from nanoexp.experiment.schema.common import ConfigError
from nanoexp.experiment.schema.engine import EngineGroup, EngineKind
from nanoexp.experiment.schema.experiment import NanoexpConfig, to_plain, to_spec
from nanoexp.experiment.schema.job_dirs import JOB_NUM_OFFSET, NAME_MAX, job_number, safe_dir_name
from nanoexp.experiment.schema.launch import LaunchConfig
from nanoexp.experiment.schema.logger import LoggerConfig, LoggerKind
from nanoexp.experiment.schema.metrics import (
    BUSY_CORES,
    MIN_DURATION_S,
    KvQualityConfig,
    MetricsConfig,
    NoiseConfig,
    SloConfig,
    WeightQualityConfig,
)
from nanoexp.experiment.schema.model import DUMMY_IF_MISSING, ArchConfig, ModelGroup
from nanoexp.experiment.schema.profile import ProfileConfig
from nanoexp.experiment.schema.report import ReportConfig
from nanoexp.experiment.schema.sampler import SamplerConfig
from nanoexp.experiment.schema.search import SEARCH_OBJECTIVES, SearchConfig
from nanoexp.experiment.schema.store import register
from nanoexp.experiment.schema.workload import (
    FIELDS_BY_KIND,
    FILE_KINDS,
    WorkloadConfig,
    WorkloadKind,
    length_range,
)

register()

__all__ = [
    "BUSY_CORES",
    "DUMMY_IF_MISSING",
    "FIELDS_BY_KIND",
    "FILE_KINDS",
    "JOB_NUM_OFFSET",
    "MIN_DURATION_S",
    "NAME_MAX",
    "SEARCH_OBJECTIVES",
    "ArchConfig",
    "CapacityConfig",
    "ConfigError",
    "EngineGroup",
    "EngineKind",
    "KvQualityConfig",
    "LaunchConfig",
    "LoggerConfig",
    "LoggerKind",
    "MetricsConfig",
    "ModelGroup",
    "NanoexpConfig",
    "NoiseConfig",
    "ProfileConfig",
    "ReportConfig",
    "SamplerConfig",
    "SearchConfig",
    "SloConfig",
    "WeightQualityConfig",
    "WorkloadConfig",
    "WorkloadKind",
    "job_number",
    "length_range",
    "safe_dir_name",
    "to_plain",
    "to_spec",
]
