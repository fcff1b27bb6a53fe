"""Models for the tests, the demo and the benchmarks, each with a seeded synthetic task.

Every model exercises what memory policies get wrong: the residual CNN has BatchNorm
(running statistics updated in place, behind a schema that does not say so), dropout (a
random op replayed bit for bit) and in-place ReLU and addition; the transformer has
attention built from views, transposes and a masked softmax, LayerNorm, GELU and dropout.
The UNet is the other shape: a wide-then-narrow encoder and decoder whose skip
connections keep the encoder's activations alive until the decoder concatenates them
(``torch.cat``), with max pooling, transposed convolutions and a per-pixel loss.
``inplace_mlp`` is the case eviction cannot help: every third layer rescales its output in
place ten times, a chain too long for the registry to replay, so those activations are
frozen — under ``recompute`` with ``spill`` off they stay on the device, and only
compaction can move them (with it on, the default, they can also leave through host
memory). ``resnet50`` (torchvision), ``gpt2`` (GPT-2 small's shape) and ``unet_gpu`` are
the GPU-sized ones.

A :class:`~pyalloc.bench.tasks.Task` knows how to build its model and a batch, so a
benchmark can vary the batch size and nothing else. ``TASKS`` holds these and the zoo's
(``zoo_*``, :mod:`pyalloc.bench.zoo`: models of the shapes users bring, from a
torchvision-style ResNet to Hugging Face GPT-2, Llama and BERT).
"""
from __future__ import annotations

import math
from typing import Dict

import torch
from torch import nn
from torch.nn import functional as F

from .tasks import Task, images, segmentation, tokens, vectors
from .wild import WILD
from .zoo import ZOO


def mlp(width: int = 512, depth: int = 6, classes: int = 10, dropout: float = 0.1) -> nn.Module:
    blocks = [nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Dropout(dropout))
              for _ in range(depth)]
    return nn.Sequential(*blocks, nn.Linear(width, classes))


class RescaledLinear(nn.Module):
    """Linear and GELU; with ``rescale``, the linear's output is scaled in place ten times
    first (GELU keeps it for backward)."""

    def __init__(self, a: int, b: int, rescale: bool) -> None:
        super().__init__()
        self.lin = nn.Linear(a, b)
        self.rescale = rescale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x)
        if self.rescale:
            for _ in range(10):
                y.mul_(0.999)
        return F.gelu(y)


def inplace_mlp(widths=(256, 384) * 4 + (256,), classes: int = 10) -> nn.Module:
    """Layers alternating between two widths (so the holes frozen activations leave are
    the wrong size for their neighbours), every third one rescaled in place."""
    layers = [RescaledLinear(widths[i], widths[i + 1], i % 3 == 0) for i in range(len(widths) - 1)]
    return nn.Sequential(*layers, nn.Dropout(0.1), nn.Linear(widths[-1], classes))


def blocks(model: nn.Module) -> list:
    """The repeated blocks of a model (what ``torch.utils.checkpoint`` wraps one by one)."""
    kinds = [ResidualBlock, TransformerBlock, ConvBlock]
    try:
        from torchvision.models.resnet import BasicBlock, Bottleneck
        kinds += [BasicBlock, Bottleneck]
    except ImportError:
        pass
    found = [m for m in model.modules() if isinstance(m, tuple(kinds))]
    if not found and isinstance(model, nn.Sequential):   # the MLP: its Sequential blocks
        found = [m for m in model if isinstance(m, nn.Sequential)]
    return found


class ResidualBlock(nn.Module):
    """conv-BN-ReLU(in place)-dropout-conv-BN, added to the input in place, ReLU in place."""

    def __init__(self, channels: int, dropout: float = 0.1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.drop = nn.Dropout(dropout)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.drop(F.relu(self.bn1(self.conv1(x)), inplace=True))
        out = self.bn2(self.conv2(out))
        out += x
        return F.relu(out, inplace=True)


def residual_cnn(width: int = 32, blocks: int = 4, classes: int = 10,
                 dropout: float = 0.1) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, width, 3, padding=1, bias=False),
        nn.BatchNorm2d(width),
        nn.ReLU(inplace=True),
        *[ResidualBlock(width, dropout) for _ in range(blocks)],
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(width, classes),
    )


class CausalSelfAttention(nn.Module):
    def __init__(self, dim: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        h = self.heads
        q, k, v = self.qkv(x).view(b, t, 3, h, c // h).permute(2, 0, 3, 1, 4).unbind(0)
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(c // h))
        causal = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
        attn = self.drop(scores.masked_fill(causal, float("-inf")).softmax(dim=-1))
        y = (attn @ v).transpose(1, 2).reshape(b, t, c)
        return self.drop(self.proj(y))


class TransformerBlock(nn.Module):
    def __init__(self, dim: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(dim)
        self.attn = CausalSelfAttention(dim, heads, dropout)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim),
                                 nn.Dropout(dropout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class Transformer(nn.Module):
    """A GPT-style decoder: token and position embeddings, pre-LN blocks, a linear head."""

    def __init__(self, vocab: int = 256, seq: int = 64, dim: int = 128, heads: int = 4,
                 layers: int = 4, dropout: float = 0.1) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(seq, dim)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.Sequential(*[TransformerBlock(dim, heads, dropout) for _ in range(layers)])
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(idx.shape[1], device=idx.device)
        x = self.drop(self.tok(idx) + self.pos(positions))
        return self.head(self.ln(self.blocks(x)))


class ConvBlock(nn.Module):
    """(conv-BN-ReLU in place) twice: the UNet's repeated unit. One tensor in, one out, so
    ``torch.utils.checkpoint`` can wrap it; the skip connections live in ``UNet.forward``."""

    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(in_channels, out_channels, 3, padding=1, bias=False),
            nn.BatchNorm2d(out_channels), nn.ReLU(inplace=True),
            nn.Conv2d(out_channels, out_channels, 3, padding=1, bias=False),
            nn.BatchNorm2d(out_channels), nn.ReLU(inplace=True))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


class UNet(nn.Module):
    """A UNet for per-pixel classification: ``depth`` encoder levels (ConvBlock, then 2x2
    max pooling, channels doubling from ``width``), a bottleneck, and decoder levels that
    upsample with a 2x2 transposed convolution and concatenate the encoder's output of the
    same resolution before their ConvBlock.

    The output is (N, H, W, classes), channels last, so that :meth:`Task.loss`'s
    ``reshape(-1, classes)`` gives one row per pixel against labels of shape (N, H, W).
    """

    def __init__(self, in_channels: int = 3, classes: int = 4, width: int = 16,
                 depth: int = 3) -> None:
        super().__init__()
        channels = [width * 2 ** level for level in range(depth + 1)]
        self.encoder = nn.ModuleList(
            ConvBlock(c_in, c_out) for c_in, c_out in zip([in_channels] + channels, channels[:depth]))
        self.pool = nn.MaxPool2d(2)
        self.bottleneck = ConvBlock(channels[depth - 1], channels[depth])
        self.upsample = nn.ModuleList(
            nn.ConvTranspose2d(channels[level + 1], channels[level], 2, stride=2)
            for level in reversed(range(depth)))
        self.decoder = nn.ModuleList(
            ConvBlock(2 * channels[level], channels[level]) for level in reversed(range(depth)))
        self.head = nn.Conv2d(width, classes, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skips = []
        for block in self.encoder:
            x = block(x)
            skips.append(x)
            x = self.pool(x)
        x = self.bottleneck(x)
        for upsample, block, skip in zip(self.upsample, self.decoder, reversed(skips)):
            x = block(torch.cat([upsample(x), skip], dim=1))
        return self.head(x).permute(0, 2, 3, 1)


def _resnet50() -> nn.Module:
    try:
        import torchvision
    except ImportError as e:   # pragma: no cover - only on machines without torchvision
        raise RuntimeError("the resnet50 task needs torchvision (pip install torchvision)") from e
    return torchvision.models.resnet50(num_classes=1000)


TASKS: Dict[str, Task] = {
    "mlp": Task("mlp", lambda: mlp(256, 8), vectors(256), 4096),
    # Small layers at a small batch: ops of tens of microseconds on a CPU, where a per-op
    # cost shows in the step time.
    "mlp_small": Task("mlp_small", lambda: mlp(128, 8), vectors(128), 256),
    "cnn": Task("cnn", lambda: residual_cnn(16, 3), images(32), 64),
    "transformer": Task("transformer", lambda: Transformer(256, 64, 128, 4, 3), tokens(256, 64), 32),
    "unet": Task("unet", lambda: UNet(3, 4, 8, 3), segmentation(64, 4), 16),
    "inplace_mlp": Task("inplace_mlp", inplace_mlp, vectors(256), 1536),
    # GPU sizes.
    "resnet50": Task("resnet50", _resnet50, images(224, 1000), 64),
    "gpt2": Task("gpt2", lambda: Transformer(50257, 1024, 768, 12, 12), tokens(50257, 1024), 4),
    "unet_gpu": Task("unet_gpu", lambda: UNet(3, 8, 32, 4), segmentation(256, 8), 16),
}

# And the zoo's: models of the shapes users bring (pyalloc/bench/zoo.py).
TASKS.update(ZOO)
# And models as users write them, untuned (pyalloc/bench/wild.py).
TASKS.update(WILD)
