"""Models as users write them, untuned: shapes the zoo lacks, to try the policies on.

The zoo (:mod:`pyalloc.bench.zoo`) is sized so that 40% of the peak is above what no
policy can evict, and tests/test_zoo.py holds every policy to that. These are not: each
was written the way a user would write it, at a batch that trains in a second or two on
a CPU, and each brings a pattern the registry must get right rather than a budget it must
reach. tests/test_wild.py trains each under recompute at a fraction of its peak where it
trains today, bit for bit.

* ``wild_inplace_resnet``: activations written in place everywhere — ``F.relu_``,
  ``x += residual``, ``x.mul_(0.5)`` — and BatchNorm's running statistics.
* ``wild_packed_bilstm``: a two-layer bidirectional LSTM over a padded batch packed by
  length (``pack_padded_sequence``). On a CPU a packed LSTM runs step by step in both
  directions, and each direction's layer ends in a ``cat`` of every step's output: one op
  reading hundreds of small tensors at once, many of them evicted.
* ``wild_encoder``: ``nn.TransformerEncoder`` with a key padding mask, pre-norm, GELU and an
  LM head tied to the embedding (``emb.weight.t()``), on padded token rows.
* ``wild_einsum_attention``: attention written by hand (``einsum``, ``masked_fill`` with a
  causal mask, ``softmax``, ``torch.where``, ``gather``), alternating with
  ``F.scaled_dot_product_attention``.
* ``wild_graph``: message passing over a random graph: fancy indexing, ``index_add_`` and
  ``scatter_add_`` into fresh zeros, ``cat``.
* ``wild_checkpointed``: a model that already calls ``torch.utils.checkpoint`` on every other
  block (the first reentrant, the others not), with dropout inside (checkpointing and recompute
  together).
* ``wild_autocast``: bfloat16 autocast around a conv net with GroupNorm, SiLU, ``cat`` and
  nearest upsampling; the head in float32.
* ``wild_moe``: a top-1 mixture of experts: ``argmax`` routing, boolean-mask indexing and
  ``index_put`` of each expert's rows, data-dependent shapes, ``chunk``.
* ``wild_gradient_penalty``: a WGAN-GP critic: the penalty differentiates through a gradient
  (``torch.autograd.grad(create_graph=True)``), and the first activation is a custom
  ``autograd.Function`` whose forward runs with grad mode off and saves its output.
"""
from __future__ import annotations

import math
from typing import Dict

import torch
from torch import nn
from torch.nn import functional as F
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from .tasks import Task, images, padded_sentences, vectors
from .zoo import ZooTask


class InplaceResNet(nn.Module):
    def __init__(self, width: int = 48, blocks: int = 4, classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, width, 3, padding=1)
        self.blocks = nn.ModuleList(nn.Sequential(
            nn.Conv2d(width, width, 3, padding=1, bias=False), nn.BatchNorm2d(width),
            nn.ReLU(inplace=True), nn.Conv2d(width, width, 3, padding=1, bias=False),
            nn.BatchNorm2d(width)) for _ in range(blocks))
        self.head = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu_(self.stem(x))
        for block in self.blocks:
            residual = x
            x = block(x)
            x += residual
            x.mul_(0.5)
            F.relu_(x)
        return self.head(x.mean((2, 3)))


class PackedBiLSTM(nn.Module):
    def __init__(self, vocab: int = 512, dim: int = 96, classes: int = 4) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, dim, padding_idx=0)
        self.rnn = nn.LSTM(dim, dim, num_layers=2, bidirectional=True, batch_first=True,
                           dropout=0.1)
        self.head = nn.Linear(2 * dim, classes)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        lengths = (idx != 0).sum(1).clamp(min=1)
        packed = pack_padded_sequence(self.emb(idx), lengths.cpu(), batch_first=True,
                                      enforce_sorted=False)
        out, _ = pad_packed_sequence(self.rnn(packed)[0], batch_first=True)
        mask = (torch.arange(out.shape[1], device=idx.device) < lengths[:, None]).unsqueeze(-1)
        return self.head((out * mask).sum(1) / lengths[:, None])


class Encoder(nn.Module):
    def __init__(self, vocab: int = 512, dim: int = 128, layers: int = 3, seq: int = 64) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.randn(1, seq, dim) * 0.02)
        layer = nn.TransformerEncoderLayer(dim, 4, 4 * dim, dropout=0.1, activation="gelu",
                                           batch_first=True, norm_first=True)
        self.enc = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(dim)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        h = self.emb(idx) + self.pos[:, :idx.shape[1]]
        h = self.enc(h, src_key_padding_mask=idx == 0)
        return self.norm(h) @ self.emb.weight.t() / math.sqrt(self.emb.embedding_dim)


class EinsumAttention(nn.Module):
    def __init__(self, width: int = 16, dim: int = 96, heads: int = 4, layers: int = 3,
                 classes: int = 10) -> None:
        super().__init__()
        self.heads = heads
        self.inp = nn.Linear(width, dim)
        self.qkv = nn.ModuleList(nn.Linear(dim, 3 * dim) for _ in range(layers))
        self.proj = nn.ModuleList(nn.Linear(dim, dim) for _ in range(layers))
        self.out = nn.Linear(dim, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        b, t, d = h.shape
        causal = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
        for i, (qkv, proj) in enumerate(zip(self.qkv, self.proj)):
            q, k, v = qkv(h).view(b, t, 3, self.heads, d // self.heads).unbind(2)
            if i % 2 == 0:
                s = torch.einsum("bthd,bshd->bhts", q, k) / math.sqrt(d // self.heads)
                a = torch.einsum("bhts,bshd->bthd", s.masked_fill(causal, float("-inf")).softmax(-1), v)
            else:
                a = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                                   v.transpose(1, 2), is_causal=True).transpose(1, 2)
            h = h + proj(a.reshape(b, t, d))
            h = torch.where(h > 0, h, 0.1 * h)
        last = torch.full((b, 1, d), t - 1, device=x.device)
        return self.out(torch.gather(h, 1, last).squeeze(1))


class GraphNet(nn.Module):
    def __init__(self, width: int = 32, dim: int = 64, layers: int = 4, classes: int = 10) -> None:
        super().__init__()
        self.inp = nn.Linear(width, dim)
        self.msg = nn.ModuleList(nn.Linear(dim, dim) for _ in range(layers))
        self.upd = nn.ModuleList(nn.Linear(2 * dim, dim) for _ in range(layers))
        self.out = nn.Linear(dim, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[0]  # one node per row; eight random edges per node, the same every call
        edges = torch.randint(0, n, (2, 8 * n), generator=torch.Generator().manual_seed(3))
        src, dst = edges.to(x.device)
        h = F.silu(self.inp(x))
        for msg, upd in zip(self.msg, self.upd):
            m = msg(h)[src]
            summed = torch.zeros_like(h).index_add_(0, dst, m)
            scattered = torch.zeros_like(h).scatter_add_(0, dst[:, None].expand(-1, h.shape[1]), m)
            h = h + F.silu(upd(torch.cat([summed, scattered], 1)))
        return self.out(h)


class Checkpointed(nn.Module):
    def __init__(self, dim: int = 256, blocks: int = 6, classes: int = 10) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(),
                                                  nn.Dropout(0.1), nn.Linear(2 * dim, dim))
                                    for _ in range(blocks))
        self.norms = nn.ModuleList(nn.LayerNorm(dim) for _ in range(blocks))
        self.out = nn.Linear(dim, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from torch.utils.checkpoint import checkpoint

        for i, (block, norm) in enumerate(zip(self.blocks, self.norms)):
            if i % 2:
                # Both kinds: the first reentrant (a backward pass inside backward).
                x = x + checkpoint(block, norm(x), use_reentrant=i == 1)
            else:
                x = x + block(norm(x))
        return self.out(x)


class AutocastConv(nn.Module):
    def __init__(self, width: int = 32, classes: int = 10) -> None:
        super().__init__()
        self.down = nn.Sequential(nn.Conv2d(3, width, 3, 2, 1), nn.GroupNorm(8, width), nn.SiLU())
        self.mid = nn.Sequential(nn.Conv2d(width, 2 * width, 3, 1, 1), nn.GroupNorm(8, 2 * width),
                                 nn.SiLU())
        self.up = nn.Conv2d(3 * width, width, 3, 1, 1)
        self.out = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast(x.device.type, dtype=torch.bfloat16):
            d = self.down(x)
            u = F.interpolate(torch.cat([d, self.mid(d)], 1), scale_factor=2, mode="nearest")
            h = F.silu(self.up(u))
        return self.out(h.float().mean((2, 3)))


class MoE(nn.Module):
    def __init__(self, width: int = 32, dim: int = 128, experts: int = 4, layers: int = 2,
                 classes: int = 10) -> None:
        super().__init__()
        self.inp = nn.Linear(width, dim)
        self.gates = nn.ModuleList(nn.Linear(dim, experts) for _ in range(layers))
        self.experts = nn.ModuleList(
            nn.ModuleList(nn.Sequential(nn.Linear(dim, 2 * dim), nn.ReLU(), nn.Linear(2 * dim, dim))
                          for _ in range(experts)) for _ in range(layers))
        self.out = nn.Linear(dim, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for gate, experts in zip(self.gates, self.experts):
            probs = gate(h).softmax(-1)
            choice = probs.argmax(-1)
            y = torch.zeros_like(h)
            for e, expert in enumerate(experts):
                rows = choice == e
                if rows.any():
                    y[rows] = expert(h[rows]) * probs[rows, e:e + 1]
            a, b = (h + y).chunk(2, dim=-1)
            h = torch.cat([a * torch.sigmoid(b), b], -1)
        return self.out(h)


class _ScaledTanh(torch.autograd.Function):
    """``1.7 * tanh(x)`` as a user writes a fused activation: its forward runs with grad
    mode off and saves its output for backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        y = torch.tanh(x) * 1.7
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        y, = ctx.saved_tensors
        return grad * (1.7 - y * y / 1.7)


class Critic(nn.Module):
    def __init__(self, width: int = 128, hidden: int = 512, depth: int = 3) -> None:
        super().__init__()
        self.inp = nn.Linear(width, hidden)
        self.hidden = nn.ModuleList(nn.Sequential(nn.Linear(hidden, hidden), nn.LayerNorm(hidden))
                                    for _ in range(depth))
        self.out = nn.Linear(hidden, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = _ScaledTanh.apply(self.inp(x))
        for layer in self.hidden:
            h = h + F.leaky_relu(layer(h), 0.2)
        return self.out(h)


def _real_and_fake(width: int):
    def batch(n: int, gen: torch.Generator):
        return torch.randn(n, width, generator=gen).tanh(), 0.5 * torch.randn(n, width, generator=gen)
    return batch


def _wgan_gp_loss(model: nn.Module, real: torch.Tensor, fake: torch.Tensor) -> torch.Tensor:
    """The WGAN-GP critic's loss: the gradient penalty differentiates through a gradient."""
    alpha = torch.linspace(0, 1, real.shape[0], device=real.device).unsqueeze(1)
    mix = (alpha * real + (1 - alpha) * fake).requires_grad_(True)
    grad, = torch.autograd.grad(model(mix).sum(), mix, create_graph=True)
    penalty = ((grad.norm(2, dim=1) - 1) ** 2).mean()
    return model(fake).mean() - model(real).mean() + 10 * penalty


def _sequences(width: int, seq: int, classes: int = 10):
    def batch(n: int, gen: torch.Generator):
        return (torch.randn(n, seq, width, generator=gen),
                torch.randint(0, classes, (n,), generator=gen))
    return batch


def _padded_lm(vocab: int, seq: int):
    """Padded token rows (0 is padding) and, as targets, each row's next tokens."""
    sentences = padded_sentences(vocab, seq, 2)

    def batch(n: int, gen: torch.Generator):
        ids, _ = sentences(n, gen)
        return ids, F.pad(ids[:, 1:], (0, 1))
    return batch


def _lm_loss_ignoring_padding(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    out = model(x)
    return F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1), ignore_index=0)


WILD: Dict[str, Task] = {
    "wild_inplace_resnet": Task("wild_inplace_resnet", InplaceResNet, images(32), 16),
    "wild_packed_bilstm": Task("wild_packed_bilstm", PackedBiLSTM,
                               padded_sentences(512, 64, 4), 48),
    "wild_encoder": ZooTask("wild_encoder", Encoder, _padded_lm(512, 64), 24,
                            loss_fn=_lm_loss_ignoring_padding),
    "wild_einsum_attention": Task("wild_einsum_attention", EinsumAttention, _sequences(16, 64), 24),
    "wild_graph": Task("wild_graph", GraphNet, vectors(32), 2048),
    "wild_checkpointed": Task("wild_checkpointed", Checkpointed, vectors(256), 1024),
    "wild_autocast": Task("wild_autocast", AutocastConv, images(32), 32),
    "wild_moe": Task("wild_moe", MoE, vectors(32), 1024),
    "wild_gradient_penalty": ZooTask("wild_gradient_penalty", Critic, _real_and_fake(128), 1024,
                                     loss_fn=_wgan_gp_loss),
}
