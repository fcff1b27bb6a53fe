"""A zoo of models of the shapes users bring, to check that eviction reaches low budgets on them.

The tasks in :mod:`pyalloc.bench.models` are the suite's own models: an MLP, a residual CNN, a
GPT-style transformer and a UNet, written for the tests. Users bring others, and each shape
gives recompute, swap and hybrid something new to get right:

* ``zoo_resnet``: a torchvision-style ResNet (Bottleneck blocks with 1x1-3x3-1x1 convolutions,
  BatchNorm, in-place ReLU, strided 1x1 downsample shortcuts added in place, a 7x7 stem with
  max pooling, adaptive average pooling), in plain torch.
* ``zoo_unet``: a residual UNet: Dropout2d, an in-place add of the shortcut onto an
  activation inside each block, bilinear upsampling (``F.interpolate``) and
  ``torch.cat`` skip connections that keep the encoder's outputs alive to the end.
* ``zoo_gru_lm``: a two-layer GRU language model with tied embedding and head. On a CPU
  ``nn.GRU`` runs step by step: hundreds of small per-timestep tensors rather than a few
  large ones (16–48 KiB each at the zoo's size), and two copies a timestep that autograd
  saves for the cell's in-place ops.
* ``zoo_lstm_lm``: a two-layer LSTM language model, tied too; on a CPU with oneDNN its
  layers are fused kernels (``mkldnn_rnn_layer``), whose workspace backward reads.
* ``zoo_vit``: a small Vision Transformer: patch convolution, a class token, learned
  position embeddings, ``nn.TransformerEncoder`` with pre-norm layers and GELU.
* ``zoo_hf_gpt2``, ``zoo_hf_llama``, ``zoo_hf_bert``: Hugging Face ``transformers`` models
  built from their configs (no download), eager attention, dropout on: GPT-2 (Conv1D
  layers, learned positions, tied head), Llama (RMSNorm, rotary embeddings, grouped-query
  attention whose key/value heads are repeated, SwiGLU) and BERT (a padded batch with an
  attention mask, a pooled classifier). They need ``pip install transformers`` (it is in
  the ``test`` extra); this module imports without it.
* ``zoo_mobilenet``: a MobileNetV3-style CNN: depthwise-separable inverted residual blocks,
  squeeze-and-excitation (a per-channel product with a pooled gate), Hardswish and SiLU.
* ``zoo_tcn``: a temporal convolutional network: dilated causal 1-D convolutions under
  weight normalization (the weights themselves are computed from parameters every
  step), cropped by slicing, and residual connections.
* ``zoo_mixer``: an MLP-Mixer: token mixing across patches (transposes) and channel mixing.
* ``zoo_densenet``: DenseNet-style blocks, each layer reading the concatenation of every
  earlier output of its block (BN-ReLU-conv-dropout), 1x1 transitions, and a head that pools
  the feature map by attention from one learned query (``nn.MultiheadAttention``).

Every task is sized for a CPU (a training step well under a second on two cores), with a
default batch at which activations are at least three quarters of the unconstrained peak:
parameters, gradients, SGD momentum, buffers and the batch together are at most a quarter
(tests/test_zoo.py checks it), so a budget of 40% of the peak is above what no policy can
evict. All are deterministic on a CPU under ``torch.use_deterministic_algorithms(True)``,
with dropout on wherever the architecture has it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, Optional, Tuple

import torch
from torch import nn
from torch.nn import functional as F
from torch.nn.utils.parametrizations import weight_norm

# The batches pyalloc.bench.models' tasks use are the zoo's too.
from .tasks import Task, images, padded_sentences, segmentation, tokens


@dataclass
class ZooTask(Task):
    """A :class:`~pyalloc.bench.tasks.Task` whose loss may be computed its own way
    (``loss_fn(model, x, y)``): the Hugging Face models return a ``ModelOutput``, BERT
    takes an attention mask."""

    loss_fn: Optional[Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]] = None

    def loss(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if self.loss_fn is not None:
            return self.loss_fn(model, x, y)
        return super().loss(model, x, y)


# --- ResNet (torchvision's, in plain torch) ----------------------------------------------
def _conv3x3(c_in: int, c_out: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(c_in, c_out, 3, stride, padding=1, bias=False)


def _conv1x1(c_in: int, c_out: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(c_in, c_out, 1, stride, bias=False)


class Bottleneck(nn.Module):
    """torchvision's Bottleneck (ResNet v1.5: the stride on the 3x3 convolution)."""

    expansion = 4

    def __init__(self, inplanes: int, planes: int, stride: int = 1,
                 downsample: Optional[nn.Module] = None) -> None:
        super().__init__()
        self.conv1 = _conv1x1(inplanes, planes)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = _conv3x3(planes, planes, stride)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = _conv1x1(planes, planes * self.expansion)
        self.bn3 = nn.BatchNorm2d(planes * self.expansion)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        return self.relu(out)


class ResNet(nn.Module):
    """torchvision's ResNet with Bottleneck blocks and a base width of ``width`` (64 there)."""

    def __init__(self, layers=(2, 2, 2, 2), width: int = 8, classes: int = 10,
                 dropout: float = 0.1) -> None:
        super().__init__()
        self.inplanes = width
        self.conv1 = nn.Conv2d(3, width, 7, 2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, padding=1)
        self.layer1 = self._make_layer(width, layers[0])
        self.layer2 = self._make_layer(width * 2, layers[1], stride=2)
        self.layer3 = self._make_layer(width * 4, layers[2], stride=2)
        self.layer4 = self._make_layer(width * 8, layers[3], stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.drop = nn.Dropout(dropout)
        self.fc = nn.Linear(width * 8 * Bottleneck.expansion, classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def _make_layer(self, planes: int, blocks: int, stride: int = 1) -> nn.Sequential:
        downsample = None
        if stride != 1 or self.inplanes != planes * Bottleneck.expansion:
            downsample = nn.Sequential(_conv1x1(self.inplanes, planes * Bottleneck.expansion, stride),
                                       nn.BatchNorm2d(planes * Bottleneck.expansion))
        layers = [Bottleneck(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes * Bottleneck.expansion
        layers += [Bottleneck(self.inplanes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(self.drop(torch.flatten(self.avgpool(x), 1)))


# --- a residual UNet -----------------------------------------------------------------------
class ResConvBlock(nn.Module):
    """conv-BN-ReLU-Dropout2d-conv-BN, the (1x1 projected) input added in place, ReLU."""

    def __init__(self, c_in: int, c_out: int, dropout: float = 0.1) -> None:
        super().__init__()
        self.conv1 = _conv3x3(c_in, c_out)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.drop = nn.Dropout2d(dropout)
        self.conv2 = _conv3x3(c_out, c_out)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.shortcut = _conv1x1(c_in, c_out) if c_in != c_out else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.drop(F.relu(self.bn1(self.conv1(x))))
        out = self.bn2(self.conv2(out))
        out += self.shortcut(x)
        return F.relu(out, inplace=True)


class ResUNet(nn.Module):
    """Encoder levels of ResConvBlocks and max pooling, channels doubling from ``width``; a
    bottleneck; decoder levels that upsample bilinearly, reduce the channels with a 1x1
    convolution, concatenate the encoder's output of the same resolution and apply a
    ResConvBlock. Output (N, H, W, classes), as models.UNet's."""

    def __init__(self, in_channels: int = 3, classes: int = 4, width: int = 8, depth: int = 3,
                 dropout: float = 0.1) -> None:
        super().__init__()
        channels = [width * 2 ** level for level in range(depth + 1)]
        self.encoder = nn.ModuleList(
            ResConvBlock(c_in, c_out, dropout)
            for c_in, c_out in zip([in_channels] + channels, channels[:depth]))
        self.bottleneck = ResConvBlock(channels[depth - 1], channels[depth], dropout)
        self.reduce = nn.ModuleList(_conv1x1(channels[level + 1], channels[level])
                                    for level in reversed(range(depth)))
        self.decoder = nn.ModuleList(ResConvBlock(2 * channels[level], channels[level], dropout)
                                     for level in reversed(range(depth)))
        self.head = nn.Conv2d(width, classes, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skips = []
        for block in self.encoder:
            x = block(x)
            skips.append(x)
            x = F.max_pool2d(x, 2)
        x = self.bottleneck(x)
        for reduce, block, skip in zip(self.reduce, self.decoder, reversed(skips)):
            up = F.interpolate(x, size=skip.shape[-2:], mode="bilinear", align_corners=False)
            x = block(torch.cat([reduce(up), skip], dim=1))
        return self.head(x).permute(0, 2, 3, 1)


# --- recurrent language models ----------------------------------------------------------------
class RNNLM(nn.Module):
    """Embedding, dropout, a multi-layer GRU or LSTM (dropout between layers), dropout, and a
    head that shares the embedding's weight."""

    def __init__(self, cell: str = "gru", vocab: int = 512, dim: int = 128, layers: int = 2,
                 dropout: float = 0.1) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        rnn = {"gru": nn.GRU, "lstm": nn.LSTM}[cell]
        self.rnn = rnn(dim, dim, layers, batch_first=True, dropout=dropout)
        self.drop = nn.Dropout(dropout)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        h, _ = self.rnn(self.drop(self.emb(idx)))
        return self.head(self.drop(h))


# --- a Vision Transformer --------------------------------------------------------------------
class ViT(nn.Module):
    def __init__(self, size: int = 32, patch: int = 4, dim: int = 64, depth: int = 4,
                 heads: int = 4, classes: int = 10, dropout: float = 0.1) -> None:
        super().__init__()
        self.patch = nn.Conv2d(3, dim, patch, patch)
        n = (size // patch) ** 2
        self.cls = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos = nn.Parameter(torch.randn(1, n + 1, dim) * 0.02)
        self.drop = nn.Dropout(dropout)
        layer = nn.TransformerEncoderLayer(dim, heads, 4 * dim, dropout=dropout, batch_first=True,
                                           norm_first=True, activation="gelu")
        self.encoder = nn.TransformerEncoder(layer, depth, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        p = self.patch(x).flatten(2).transpose(1, 2)
        h = self.drop(torch.cat([self.cls.expand(x.shape[0], -1, -1), p], 1) + self.pos)
        return self.head(self.norm(self.encoder(h))[:, 0])


# --- MobileNetV3-style -----------------------------------------------------------------------
class SqueezeExcite(nn.Module):
    def __init__(self, channels: int, reduced: int) -> None:
        super().__init__()
        self.fc1 = nn.Conv2d(channels, reduced, 1)
        self.fc2 = nn.Conv2d(reduced, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate = F.hardsigmoid(self.fc2(F.relu(self.fc1(F.adaptive_avg_pool2d(x, 1)))))
        return x * gate


class InvertedResidual(nn.Module):
    """1x1 expansion, depthwise 3x3 (stride), squeeze-excitation, 1x1 projection; the input
    added back when the shape allows."""

    def __init__(self, c_in: int, expanded: int, c_out: int, stride: int, act: type,
                 se: bool) -> None:
        super().__init__()
        self.residual = stride == 1 and c_in == c_out
        self.body = nn.Sequential(
            nn.Conv2d(c_in, expanded, 1, bias=False), nn.BatchNorm2d(expanded), act(),
            nn.Conv2d(expanded, expanded, 3, stride, 1, groups=expanded, bias=False),
            nn.BatchNorm2d(expanded), act(),
            SqueezeExcite(expanded, max(8, expanded // 4)) if se else nn.Identity(),
            nn.Conv2d(expanded, c_out, 1, bias=False), nn.BatchNorm2d(c_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.body(x)
        return out + x if self.residual else out


def mobilenet(classes: int = 10, dropout: float = 0.2) -> nn.Module:
    # (in, expanded, out, stride, activation, squeeze-excite)
    spec = [(16, 16, 16, 2, nn.ReLU, True), (16, 64, 24, 2, nn.ReLU, False),
            (24, 72, 24, 1, nn.ReLU, False), (24, 96, 40, 2, nn.Hardswish, True),
            (40, 160, 40, 1, nn.Hardswish, True), (40, 120, 48, 1, nn.SiLU, True),
            (48, 144, 48, 1, nn.SiLU, True), (48, 192, 64, 2, nn.Hardswish, True)]
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, 2, 1, bias=False), nn.BatchNorm2d(16), nn.Hardswish(),
        *[InvertedResidual(*s) for s in spec],
        nn.Conv2d(64, 256, 1, bias=False), nn.BatchNorm2d(256), nn.Hardswish(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        nn.Linear(256, 256), nn.Hardswish(), nn.Dropout(dropout), nn.Linear(256, classes))


# --- a temporal convolutional network -----------------------------------------------------------
class TemporalBlock(nn.Module):
    """Two dilated causal convolutions (padded on both sides, the future cropped off by
    slicing) under weight normalization, ReLU and dropout; a residual connection."""

    def __init__(self, c_in: int, c_out: int, kernel: int, dilation: int,
                 dropout: float) -> None:
        super().__init__()
        self.crop = (kernel - 1) * dilation
        self.conv1 = weight_norm(nn.Conv1d(c_in, c_out, kernel, padding=self.crop, dilation=dilation))
        self.conv2 = weight_norm(nn.Conv1d(c_out, c_out, kernel, padding=self.crop, dilation=dilation))
        self.drop = nn.Dropout(dropout)
        self.shortcut = nn.Conv1d(c_in, c_out, 1) if c_in != c_out else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.drop(F.relu(self.conv1(x)[:, :, :-self.crop]))
        out = self.drop(F.relu(self.conv2(out)[:, :, :-self.crop]))
        return F.relu(out + self.shortcut(x))


class TCN(nn.Module):
    """Per-timestep classification of a multichannel signal: output (N, T, classes)."""

    def __init__(self, c_in: int = 8, channels: int = 32, levels: int = 4, kernel: int = 3,
                 classes: int = 10, dropout: float = 0.1) -> None:
        super().__init__()
        self.blocks = nn.Sequential(*[
            TemporalBlock(c_in if i == 0 else channels, channels, kernel, 2 ** i, dropout)
            for i in range(levels)])
        self.head = nn.Linear(channels, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(x).transpose(1, 2))


# --- an MLP-Mixer --------------------------------------------------------------------------------
class MixerBlock(nn.Module):
    def __init__(self, tokens: int, dim: int, token_hidden: int, channel_hidden: int,
                 dropout: float) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.token_mlp = nn.Sequential(nn.Linear(tokens, token_hidden), nn.GELU(),
                                       nn.Dropout(dropout), nn.Linear(token_hidden, tokens))
        self.norm2 = nn.LayerNorm(dim)
        self.channel_mlp = nn.Sequential(nn.Linear(dim, channel_hidden), nn.GELU(),
                                         nn.Dropout(dropout), nn.Linear(channel_hidden, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.token_mlp(self.norm1(x).transpose(1, 2)).transpose(1, 2)
        return x + self.channel_mlp(self.norm2(x))


class Mixer(nn.Module):
    def __init__(self, size: int = 32, patch: int = 4, dim: int = 64, depth: int = 4,
                 classes: int = 10, dropout: float = 0.1) -> None:
        super().__init__()
        tokens = (size // patch) ** 2
        self.stem = nn.Conv2d(3, dim, patch, patch)
        self.blocks = nn.Sequential(*[MixerBlock(tokens, dim, tokens * 2, dim * 4, dropout)
                                      for _ in range(depth)])
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.blocks(self.stem(x).flatten(2).transpose(1, 2))
        return self.head(self.norm(h).mean(dim=1))


# --- DenseNet-style, with an attention-pooled head -------------------------------------------
class DenseBlock(nn.Module):
    """Layers of BN-ReLU-3x3 conv-dropout, each reading ``torch.cat`` of the block's input
    and every earlier layer's output; returns the concatenation of all of them."""

    def __init__(self, channels: int, growth: int, layers: int, dropout: float = 0.1) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            nn.Sequential(nn.BatchNorm2d(channels + i * growth), nn.ReLU(),
                          _conv3x3(channels + i * growth, growth), nn.Dropout(dropout))
            for i in range(layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        features = [x]
        for layer in self.layers:
            features.append(layer(torch.cat(features, 1)))
        return torch.cat(features, 1)


class DenseNet(nn.Module):
    def __init__(self, growth: int = 12, layers: int = 4, classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 3, padding=1)
        self.block1 = DenseBlock(16, growth, layers)
        self.transition1 = _conv1x1(16 + layers * growth, 32)
        self.block2 = DenseBlock(32, growth, layers)
        self.transition2 = _conv1x1(32 + layers * growth, 48)
        self.query = nn.Parameter(torch.randn(1, 1, 48) * 0.1)
        self.pool = nn.MultiheadAttention(48, 4, batch_first=True)
        self.head = nn.Linear(48, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.avg_pool2d(self.transition1(self.block1(self.stem(x))), 2)
        x = self.transition2(self.block2(x))
        tokens = x.flatten(2).transpose(1, 2)
        pooled, _ = self.pool(self.query.expand(x.shape[0], -1, -1), tokens, tokens)
        return self.head(pooled[:, 0])


# --- Hugging Face transformers ---------------------------------------------------------------
def _transformers():
    try:
        import transformers
    except ImportError as e:
        raise RuntimeError(
            "the zoo_hf_* tasks need Hugging Face transformers: pip install transformers "
            "(or pip install '.[test]')") from e
    return transformers


def _hf_gpt2(vocab: int, seq: int) -> nn.Module:
    t = _transformers()
    config = t.GPT2Config(vocab_size=vocab, n_positions=seq, n_embd=64, n_layer=2, n_head=4,
                          resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.1, use_cache=False,
                          attn_implementation="eager")
    return t.GPT2LMHeadModel(config)


def _hf_llama(vocab: int, seq: int) -> nn.Module:
    t = _transformers()
    config = t.LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=176,
                           num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                           max_position_embeddings=seq, attention_dropout=0.1, use_cache=False,
                           attn_implementation="eager")
    return t.LlamaForCausalLM(config)


def _hf_bert(vocab: int, seq: int, classes: int) -> nn.Module:
    t = _transformers()
    config = t.BertConfig(vocab_size=vocab, hidden_size=64, num_hidden_layers=2,
                          num_attention_heads=4, intermediate_size=256,
                          max_position_embeddings=seq, num_labels=classes,
                          hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1,
                          attn_implementation="eager")
    return t.BertForSequenceClassification(config)


def _causal_lm_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The logits of a Hugging Face causal LM against the next tokens (``y`` is already
    shifted by :func:`~pyalloc.bench.tasks.tokens`)."""
    logits = model(input_ids=x).logits
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


def _masked_classifier_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """A sequence classifier on a padded batch: token 0 is padding, masked out."""
    logits = model(input_ids=x, attention_mask=(x != 0).long()).logits
    return F.cross_entropy(logits, y)


# --- data (images, segmentation maps and token streams: pyalloc.bench.tasks') ------------------
Batch = Callable[[int, torch.Generator], Tuple[torch.Tensor, torch.Tensor]]


def _signals(channels: int, length: int, classes: int) -> Batch:
    def batch(n: int, gen: torch.Generator):
        return (torch.randn(n, channels, length, generator=gen),
                torch.randint(0, classes, (n, length), generator=gen))
    return batch


ZOO: Dict[str, Task] = {
    "zoo_resnet": ZooTask("zoo_resnet", lambda: ResNet((2, 2, 2, 2), 8), images(64), 32),
    "zoo_unet": ZooTask("zoo_unet", lambda: ResUNet(3, 4, 8, 3), segmentation(64, 4), 8),
    "zoo_gru_lm": ZooTask("zoo_gru_lm", lambda: RNNLM("gru", 512, 128, 2), tokens(512, 64), 32),
    "zoo_lstm_lm": ZooTask("zoo_lstm_lm", lambda: RNNLM("lstm", 512, 128, 2), tokens(512, 64), 32),
    "zoo_vit": ZooTask("zoo_vit", lambda: ViT(32, 4, 64, 4, 4), images(32), 32),
    "zoo_hf_gpt2": ZooTask("zoo_hf_gpt2", lambda: _hf_gpt2(512, 64), tokens(512, 64), 16,
                           loss_fn=_causal_lm_loss),
    "zoo_hf_llama": ZooTask("zoo_hf_llama", lambda: _hf_llama(512, 64), tokens(512, 64), 16,
                            loss_fn=_causal_lm_loss),
    "zoo_hf_bert": ZooTask("zoo_hf_bert", lambda: _hf_bert(512, 64, 4),
                           padded_sentences(512, 64, 4), 16, loss_fn=_masked_classifier_loss),
    "zoo_mobilenet": ZooTask("zoo_mobilenet", mobilenet, images(64), 32),
    "zoo_tcn": ZooTask("zoo_tcn", TCN, _signals(8, 512, 10), 16),
    "zoo_mixer": ZooTask("zoo_mixer", lambda: Mixer(32, 4, 64, 4), images(32), 32),
    "zoo_densenet": ZooTask("zoo_densenet", DenseNet, images(32), 32),
}
