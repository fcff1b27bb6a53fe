"""The UNet task (pyalloc.bench.models.UNet): the model of a different shape in the benchmark suite.

Its skip connections keep the encoder's outputs alive until the decoder concatenates them,
and it has max pooling (an op with two outputs, the indices saved for backward) and
transposed convolutions, which the other models do not: recompute must replay them bit
for bit as well.
"""
from __future__ import annotations

import pytest

import torch

from conftest import train
from pyalloc.bench import models


def test_output_is_one_row_of_logits_per_pixel_and_the_blocks_are_checkpointable():
    task = models.TASKS["unet"]
    torch.manual_seed(0)
    model = task.build()
    x, y = task.batch(2, torch.Generator().manual_seed(1))
    out = model(x)
    assert out.shape == (2, 64, 64, 4) and y.shape == (2, 64, 64)
    loss = task.loss(model, x, y)
    loss.backward()
    assert torch.isfinite(loss) and all(p.grad is not None for p in model.parameters())
    blocks = models.blocks(model)
    # encoder levels, bottleneck, decoder levels: each one tensor in, one out
    assert len(blocks) == 7 and all(isinstance(b, models.ConvBlock) for b in blocks)


@pytest.mark.slow
def test_recompute_trains_bit_identically_at_40_percent_of_peak():
    free = train("unet", "2GiB", steps=4, batch=8)
    budget = int(0.4 * free["peak"])
    tight = train("unet", budget, steps=4, batch=8, policy="recompute")
    assert len(tight["record"]) == 5
    assert tight["record"] == free["record"]
    assert tight["peak"] <= budget
    assert tight["evictions"] > 0 and tight["recomputes"] > 0, tight
