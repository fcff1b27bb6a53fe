# Untuned: a torchvision video transformer built without weights and trained as torchvision's video
# classification reference script does, for 3 steps on random clips: SGD (momentum 0.9, weight decay
# 1e-4) with a LinearLR warmup, a label-smoothed cross entropy, clip_grad_norm_; then evaluation in
# eval mode on a clip. MODEL=swin3d_t (default; shifted 3D windows: roll, window partition by
# view/permute, a relative position bias gathered by index, attention masks for the shifted windows,
# patch merging by strided slicing and cat, stochastic depth) or mvit_v2_s (multiscale ViT: pooling
# attention by strided Conv3d on queries, keys and values, decomposed relative positions added by
# einsum, a residual pooling connection, a class token; 16 frames at 224 px, the only size its
# positional parameters take). B=N: clips per batch; T=N, S=N: frames and side (swin3d_t only).
# Needs torchvision (any build: these models use no torchvision C++ operator).
import os
import torch, torch.nn as nn
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True)
import torchvision.models.video as V
MODEL = os.environ.get("MODEL", "swin3d_t")
NC = 5
if MODEL == "mvit_v2_s":
    shape = (int(os.environ.get("B", "1")), 3, 16, 224, 224)
else:
    shape = (int(os.environ.get("B", "4")), 3, int(os.environ.get("T", "16")), int(os.environ.get("S", "96")),
             int(os.environ.get("S", "96")))
model = getattr(V, MODEL)(weights=None, num_classes=NC)
model.train()
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
sched = torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.1, total_iters=2)
crit = nn.CrossEntropyLoss(label_smoothing=0.1)
g = torch.Generator().manual_seed(1)
losses = []
for step in range(3):
    clip = torch.randn(*shape, generator=g)
    y = torch.randint(0, NC, (shape[0],), generator=g)
    loss = crit(model(clip), y)
    opt.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step(); sched.step()
    losses.append(loss.detach())
model.eval()
with torch.no_grad():
    losses.append(model(clip[:1]).square().mean())
report(policy, [model], losses)
