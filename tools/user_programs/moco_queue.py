# Untuned: MoCo v2 (written after the official moco/builder.py). Query encoder (conv + BN + MLP head)
# and a momentum key encoder updated by an in-place EMA of .data under no_grad; shuffled BN for the
# keys via a torch.randperm index and its inverse argsort; a registered feature-queue buffer,
# normalized at init and updated in place with the detached keys (queue[:, ptr:ptr+B] = k.T) inside
# forward; InfoNCE over [positive, queue] logits built with torch.einsum, temperature 0.2; SGD. 3 steps.
import torch, torch.nn as nn, torch.nn.functional as F
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True)
def encoder(dim):
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(inplace=True),
        nn.Conv2d(32, 64, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(64), nn.ReLU(inplace=True),
        nn.Conv2d(64, 64, 3, padding=1, bias=False), nn.BatchNorm2d(64), nn.ReLU(inplace=True),
        nn.Conv2d(64, 128, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(128), nn.ReLU(inplace=True),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, dim))
class MoCo(nn.Module):
    def __init__(self, dim=128, K=1024, m=0.999, T=0.2):
        super().__init__()
        self.K, self.m, self.T = K, m, T
        self.encoder_q = encoder(dim)
        self.encoder_k = encoder(dim)
        for param_q, param_k in zip(self.encoder_q.parameters(), self.encoder_k.parameters()):
            param_k.data.copy_(param_q.data)
            param_k.requires_grad = False
        self.register_buffer("queue", torch.randn(dim, K))
        self.queue = nn.functional.normalize(self.queue, dim=0)
        self.register_buffer("queue_ptr", torch.zeros(1, dtype=torch.long))
    @torch.no_grad()
    def _momentum_update_key_encoder(self):
        for param_q, param_k in zip(self.encoder_q.parameters(), self.encoder_k.parameters()):
            param_k.data.mul_(self.m).add_(param_q.data, alpha=1 - self.m)
    @torch.no_grad()
    def _dequeue_and_enqueue(self, keys):
        batch_size = keys.shape[0]
        ptr = int(self.queue_ptr)
        assert self.K % batch_size == 0
        self.queue[:, ptr:ptr + batch_size] = keys.T
        ptr = (ptr + batch_size) % self.K
        self.queue_ptr[0] = ptr
    @torch.no_grad()
    def _batch_shuffle(self, x):
        idx_shuffle = torch.randperm(x.shape[0])
        idx_unshuffle = torch.argsort(idx_shuffle)
        return x[idx_shuffle], idx_unshuffle
    def forward(self, im_q, im_k):
        q = self.encoder_q(im_q)
        q = nn.functional.normalize(q, dim=1)
        with torch.no_grad():
            self._momentum_update_key_encoder()
            im_k, idx_unshuffle = self._batch_shuffle(im_k)
            k = self.encoder_k(im_k)
            k = nn.functional.normalize(k, dim=1)
            k = k[idx_unshuffle]
        l_pos = torch.einsum("nc,nc->n", [q, k]).unsqueeze(-1)
        l_neg = torch.einsum("nc,ck->nk", [q, self.queue.clone().detach()])
        logits = torch.cat([l_pos, l_neg], dim=1)
        logits /= self.T
        labels = torch.zeros(logits.shape[0], dtype=torch.long)
        self._dequeue_and_enqueue(k)
        return logits, labels
model = MoCo()
model.train()
criterion = nn.CrossEntropyLoss()
opt = torch.optim.SGD(filter(lambda p: p.requires_grad, model.parameters()), lr=0.03, momentum=0.9, weight_decay=1e-4)
B = 128
g = torch.Generator().manual_seed(1)
def augment(x):
    flip = torch.rand(x.shape[0], 1, 1, 1, generator=g) < 0.5
    x = torch.where(flip, x.flip(3), x)
    return x * (0.8 + 0.4 * torch.rand(x.shape[0], 1, 1, 1, generator=g)) + 0.1 * torch.randn(x.shape, generator=g)
losses = []
for step in range(3):
    images = torch.rand(B, 3, 32, 32, generator=g)
    im_q, im_k = augment(images), augment(images)
    output, target = model(im_q, im_k)
    loss = criterion(output, target)
    acc1 = (output.argmax(1) == target).float().mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    losses += [loss.detach(), acc1]
report(policy, [model], losses)
