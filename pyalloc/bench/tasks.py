"""A benchmark task: a model and its seeded synthetic data, so that a benchmark can vary
the batch size and nothing else; and the batches the lab's models train on."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Tuple

import torch
from torch import nn
from torch.nn import functional as F


@dataclass
class Task:
    """A model and its synthetic data: ``build()``, ``batch(n)``, ``loss(model, x, y)``."""

    name: str
    build: Callable[[], nn.Module]
    batch: Callable[[int, torch.Generator], Tuple[torch.Tensor, torch.Tensor]]
    default_batch: int

    def loss(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        out = model(x)
        return F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))


def images(size: int, classes: int = 10):
    def batch(n: int, gen: torch.Generator):
        return torch.randn(n, 3, size, size, generator=gen), torch.randint(0, classes, (n,), generator=gen)
    return batch


def tokens(vocab: int, seq: int):
    def batch(n: int, gen: torch.Generator):
        data = torch.randint(0, vocab, (n, seq + 1), generator=gen)
        return data[:, :-1].contiguous(), data[:, 1:].contiguous()
    return batch


def vectors(width: int, classes: int = 10):
    def batch(n: int, gen: torch.Generator):
        return torch.randn(n, width, generator=gen), torch.randint(0, classes, (n,), generator=gen)
    return batch


def segmentation(size: int, classes: int):
    """Images and a class per pixel (labels N x H x W, as the UNet's output is N x H x W x C)."""
    def batch(n: int, gen: torch.Generator):
        return (torch.randn(n, 3, size, size, generator=gen),
                torch.randint(0, classes, (n, size, size), generator=gen))
    return batch


def padded_sentences(vocab: int, seq: int, classes: int):
    """Token ids 1..vocab-1, each row padded with 0 after a random length (at least a
    quarter of ``seq``), and a class per row."""
    def batch(n: int, gen: torch.Generator):
        ids = torch.randint(1, vocab, (n, seq), generator=gen)
        lengths = torch.randint(seq // 4, seq + 1, (n, 1), generator=gen)
        ids = ids.masked_fill(torch.arange(seq) >= lengths, 0)
        return ids, torch.randint(0, classes, (n,), generator=gen)
    return batch
