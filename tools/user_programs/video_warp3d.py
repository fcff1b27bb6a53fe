# Untuned: video frame interpolation on 5-D tensors with gradient accumulation. A Conv3d encoder
# (ReplicationPad3d, GroupNorm, SiLU) with MaxPool3d(return_indices=True) and a MaxUnpool3d decoder
# using those indices; a 3-D flow field predicted per voxel warps the clip by F.grid_sample on a 5-D
# input (trilinear, a base grid from F.affine_grid of 3x4 thetas); patch embeddings by F.unfold on
# the middle frame and F.fold back after a linear mixer (overlapping patches, divided by the fold of
# ones); a channel-gating step scales every other channel of an activation in place
# (h[:, ::2].mul_(gate)) and clamps a narrow slice in place. The decoder blocks run under
# torch.utils.checkpoint(use_reentrant=False). Four micro-batches are accumulated per optimiser step
# (loss / 4, backward each) with a user-written "no_sync" flag that skips a grad-norm statistic on
# all but the last; a validation pass under torch.no_grad after each step with early stopping
# (patience 1) on it. Adam with amsgrad, 3 steps at most.
import torch, torch.nn as nn, torch.nn.functional as F
from torch.utils.checkpoint import checkpoint
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True, warn_only=True)
MB, T, R, C = 2, 8, 48, 32
class Net(nn.Module):
    def __init__(s):
        super().__init__()
        s.enc = nn.Sequential(nn.ReplicationPad3d(1), nn.Conv3d(3, C, 3), nn.GroupNorm(4, C), nn.SiLU(),
                              nn.Conv3d(C, C, 3, padding=1), nn.SiLU())
        s.pool = nn.MaxPool3d((1, 2, 2), return_indices=True)
        s.mid = nn.Sequential(nn.Conv3d(C, 2 * C, 3, padding=1), nn.GroupNorm(4, 2 * C), nn.SiLU(), nn.Conv3d(2 * C, C, 3, padding=1))
        s.unpool = nn.MaxUnpool3d((1, 2, 2))
        s.gate = nn.Linear(C, C // 2)
        s.dec1 = nn.Sequential(nn.Conv3d(2 * C, C, 3, padding=1), nn.SiLU())
        s.dec2 = nn.Sequential(nn.Conv3d(C, C, 3, padding=1), nn.SiLU())
        s.flow = nn.Conv3d(C, 3, 3, padding=1)
        s.mixer = nn.Linear(3 * 4 * 4, 3 * 4 * 4)
        s.out = nn.Conv2d(6, 3, 3, padding=1)
    def forward(s, clip):                      # clip: (N, 3, T, R, R); the middle frame is to be predicted
        n = clip.shape[0]
        e = s.enc(clip)
        p, idx = s.pool(e)
        m = s.mid(p)
        u = s.unpool(m, idx, output_size=e.shape[2:])
        h = torch.cat([u, e], 1)
        h = checkpoint(s.dec1, h, use_reentrant=False)
        gate = torch.sigmoid(s.gate(h.mean((2, 3, 4))))
        h[:, ::2].mul_(gate[:, :, None, None, None])          # in place on a strided view of an activation
        h.narrow(1, 1, 4).clamp_(-2.0, 2.0)
        h = checkpoint(s.dec2, h, use_reentrant=False)
        flow = torch.tanh(s.flow(h)).permute(0, 2, 3, 4, 1) * 0.1
        theta = torch.eye(3, 4).expand(n, 3, 4)
        base = F.affine_grid(theta, (n, 3, T, R, R), align_corners=False)
        warped = F.grid_sample(clip, base + flow, mode="bilinear", padding_mode="border", align_corners=False)
        mid = warped[:, :, T // 2]
        cols = F.unfold(mid, 4, stride=2, padding=1)          # (n, 48, L)
        mixed = s.mixer(cols.transpose(1, 2)).transpose(1, 2)
        ones = F.fold(torch.ones_like(cols), (R, R), 4, stride=2, padding=1)
        back = F.fold(mixed, (R, R), 4, stride=2, padding=1) / ones
        return s.out(torch.cat([mid, back], 1))
model = Net()
opt = torch.optim.Adam(model.parameters(), lr=1e-3, amsgrad=True)
g = torch.Generator().manual_seed(1)
def clip_batch(n):
    base = torch.rand(n, 3, 1, R, R, generator=g)
    shift = torch.arange(T).view(1, 1, T, 1, 1) * 0.05
    clip = torch.roll(base.expand(-1, -1, T, -1, -1) + shift, 1, dims=-1) + 0.02 * torch.randn(n, 3, T, R, R, generator=g)
    target = clip[:, :, T // 2].clone()
    clip = clip.clone(); clip[:, :, T // 2] = 0.5 * (clip[:, :, T // 2 - 1] + clip[:, :, T // 2 + 1])
    return clip, target
val = clip_batch(2)
losses, best, bad = [], float("inf"), 0
for step in range(3):
    opt.zero_grad()
    stats = []
    for k in range(4):
        clip, target = clip_batch(MB)
        sync = k == 3
        pred = model(clip)
        loss = F.l1_loss(pred, target) / 4
        loss.backward()
        if sync:
            stats.append(torch.sqrt(sum(p.grad.pow(2).sum() for p in model.parameters())))
        losses.append(loss.detach())
    opt.step()
    with torch.no_grad():
        vl = F.l1_loss(model(val[0]), val[1])
    losses += stats + [vl]
    if vl.item() < best - 1e-4: best, bad = vl.item(), 0
    else:
        bad += 1
        if bad > 1: break
report(policy, [model], losses)
