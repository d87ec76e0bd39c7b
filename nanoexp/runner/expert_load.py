"""Tokens routed to each expert of each MoE layer, counted on the device during a step (one int32
[moe layers, experts] buffer the layers add into, graphs included) and read back with the step's
sampled ids: no host sync per layer."""

from __future__ import annotations

import torch
from torch import nn

from nanoexp.layers.fused_moe import moe_layers


class ExpertLoadCounter:
    def __init__(self, model: nn.Module, device: torch.device):
        layers = moe_layers(model)
        self.num_experts = layers[0].num_experts
        self.counts = torch.zeros(len(layers), self.num_experts, dtype=torch.int32, device=device)
        for i, layer in enumerate(layers):
            layer.load_counts = self.counts[i]

    @classmethod
    def for_model(cls, model: nn.Module, device: torch.device, enabled: bool) -> ExpertLoadCounter | None:
        """A counter where the model has MoE layers and counting is on, else None."""
        return cls(model, device) if enabled and moe_layers(model) else None

    def start_step(self) -> torch.Tensor:
        """Zeroes the counts (enqueued before the step's forward pass); the buffer the step fills."""
        self.counts.zero_()
        return self.counts
