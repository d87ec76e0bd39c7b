"""The `metrics` section: the SLOs of goodput, the quality probes (KV cache, quantized weights) and when a
job's numbers are flagged noisy."""

from __future__ import annotations

from dataclasses import dataclass, field

from nanoexp.config.checks import integer, number

# Measured (README, Statistics; experiments/verdicts/): other load above this many cores in a repeat
# costs a 2-core CPU job more than its run-to-run noise; a repeat shorter than MIN_DURATION_S on a device
# does not repeat within ~5% from one run to the next.
BUSY_CORES = 0.15
MIN_DURATION_S = {"cpu": 1.0, "cuda": 0.5}


@dataclass
class SloConfig:
    """Service-level objectives as vLLM's `--goodput`: a request is good when it meets every one set."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2el_ms: float | None = None
    attainment: float = 0.9  # a load meets the SLOs when this share of its requests does (capacity search)

    def __post_init__(self) -> None:
        for name, value in self.as_dict().items():
            number(f"metrics.slo.{name}", value, lambda v: v > 0, "null or a number > 0 (milliseconds)")
        number("metrics.slo.attainment", self.attainment, lambda v: 0 < v <= 1, "a number in (0, 1]")

    def as_dict(self) -> dict[str, float]:
        """The latency limits that are set (ms), by metric."""
        return {k: v for k, v in vars(self).items() if v is not None and k != "attainment"}


@dataclass
class KvQualityConfig:
    """The KV-cache quality probe: `num_requests` prompts (0 = off), `num_tokens` greedy tokens each."""

    num_requests: int = 4
    num_tokens: int = 8
    lossless: bool = False

    def __post_init__(self) -> None:
        integer("metrics.kv_quality.num_requests", self.num_requests, 0, " (0 = off)")
        integer("metrics.kv_quality.num_tokens", self.num_tokens, 1)


@dataclass
class WeightQualityConfig:
    """What quantized weights cost in accuracy (model.quantization != none, an unquantized checkpoint):
    `num_requests` prompts (0 = off), each continued `num_tokens` greedy tokens by the job's engine and
    scored against the unquantized model (KV cache in the model dtype) on the same tokens."""

    num_requests: int = 4
    num_tokens: int = 8

    def __post_init__(self) -> None:
        integer("metrics.weight_quality.num_requests", self.num_requests, 0, " (0 = off)")
        integer("metrics.weight_quality.num_tokens", self.num_tokens, 1)


@dataclass
class NoiseConfig:
    """When a job is flagged noisy: other load above `busy_cores` in a repeat (the job is then shown but
    used for no verdict), a repeat shorter than `min_duration_s` (null: the device's, MIN_DURATION_S),
    or a CI wider than `max_ci_share`. Both numbers are measured: README, Statistics."""

    busy_cores: float = BUSY_CORES
    max_ci_share: float = 0.1
    min_duration_s: float | None = None

    def __post_init__(self) -> None:
        number("metrics.noise.busy_cores", self.busy_cores, lambda v: v >= 0, "a number >= 0 (cores)")
        number("metrics.noise.max_ci_share", self.max_ci_share, lambda v: v > 0, "a number > 0 (0.1 = 10%)")
        if self.min_duration_s is not None:
            number(
                "metrics.noise.min_duration_s",
                self.min_duration_s,
                lambda v: v >= 0,
                "null or a number >= 0 (s)",
            )

    def min_duration(self, device: str) -> float:
        if self.min_duration_s is not None:
            return self.min_duration_s
        return MIN_DURATION_S.get(device, MIN_DURATION_S["cpu"])


@dataclass
class MetricsConfig:
    slo: SloConfig = field(default_factory=SloConfig)
    kv_quality: KvQualityConfig = field(default_factory=KvQualityConfig)
    weight_quality: WeightQualityConfig = field(default_factory=WeightQualityConfig)
    noise: NoiseConfig = field(default_factory=NoiseConfig)
