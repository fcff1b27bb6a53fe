# Untuned: a LightningModule trained by lightning.Trainer(accelerator="cpu", devices=1,
# max_steps=3, enable_checkpointing=False, logger=False, enable_progress_bar=False,
# enable_model_summary=False, deterministic=True) with accumulate_grad_batches=2 and
# gradient clipping; 4 training batches an epoch (limit_train_batches), so the 3 optimizer steps
# span two epochs with a validation loop (limit_val_batches=2, self.log("val_loss")) between;
# a LR scheduler in configure_optimizers; training losses collected detached in training_step and
# reported at the end (with the validation losses). MODEL picks the variant:
#   cnn (default): a small CNN with BatchNorm and dropout, SGD+momentum with StepLR (per epoch),
#     gradient_clip_val=1.0 (norm), callbacks StochasticWeightAveraging (swa_epoch_start=1:
#     averaged weights written back at the end) and EarlyStopping on val_loss.
#   transformer: a small nn.TransformerEncoder classifier (norm_first, dropout) with AdamW and
#     OneCycleLR stepped per step ("interval": "step"), gradient_clip_algorithm="value".
#   manual: automatic_optimization=False, two optimizers (an encoder and a head), manual_backward,
#     self.clip_gradients, manual accumulation every 2 batches, toggle_optimizer, and a
#     scheduler stepped by hand.
#   bf16: the CNN under precision="bf16-mixed" (CPU autocast) with AdamW and CosineAnnealingLR.
import os
import torch, torch.nn as nn, torch.nn.functional as F
from common import setup, report
policy = setup()   # pyalloc.install before the model is made
from vision_libs import define_torchvision_ops
define_torchvision_ops()  # transformers, peft and lightning import torchvision (vision_libs.py)
import lightning as L
from lightning.pytorch.callbacks import StochasticWeightAveraging, EarlyStopping
from torch.utils.data import TensorDataset, DataLoader
M = os.environ.get("MODEL", "cnn")
L.seed_everything(0, verbose=False)
g = torch.Generator().manual_seed(1)
if M == "transformer":
    X = torch.randint(0, 500, (96, 48), generator=g); Y = torch.randint(0, 5, (96,), generator=g)
else:
    X = torch.randn(96, 3, 32, 32, generator=g); Y = torch.randint(0, 10, (96,), generator=g)
train_dl = DataLoader(TensorDataset(X[:64], Y[:64]), batch_size=16, shuffle=True, generator=torch.Generator().manual_seed(2))
val_dl = DataLoader(TensorDataset(X[64:], Y[64:]), batch_size=16)
train_losses, val_losses = [], []

def cnn():
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(64, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        nn.Flatten(), nn.Dropout(0.3), nn.Linear(64, 10))

class TxNet(nn.Module):
    def __init__(s):
        super().__init__()
        s.emb = nn.Embedding(500, 96); s.pos = nn.Parameter(torch.randn(48, 96) * 0.02)
        s.enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(96, 4, 192, dropout=0.1, batch_first=True, norm_first=True), 3,
                                      enable_nested_tensor=False)
        s.out = nn.Linear(96, 5)
    def forward(s, x):
        return s.out(s.enc(s.emb(x) + s.pos).mean(1))

class Lit(L.LightningModule):
    def __init__(s):
        super().__init__()
        s.net = TxNet() if M == "transformer" else cnn()
        if M == "manual":
            s.automatic_optimization = False
    def forward(s, x): return s.net(x)
    def training_step(s, batch, i):
        x, y = batch
        if M != "manual":
            loss = F.cross_entropy(s(x), y)
            train_losses.append(loss.detach().float())
            return loss
        enc_opt, head_opt = s.optimizers()
        sch = s.lr_schedulers()
        loss = F.cross_entropy(s(x), y) / 2
        s.manual_backward(loss)
        train_losses.append(loss.detach())
        if (i + 1) % 2 == 0:
            for o in (enc_opt, head_opt):
                s.toggle_optimizer(o)
                s.clip_gradients(o, gradient_clip_val=0.5, gradient_clip_algorithm="norm")
                o.step(); o.zero_grad()
                s.untoggle_optimizer(o)
            sch.step()
    def validation_step(s, batch, i):
        x, y = batch
        loss = F.cross_entropy(s(x), y)
        val_losses.append(loss.detach().float())
        s.log("val_loss", loss)
    def configure_optimizers(s):
        if M == "cnn":
            opt = torch.optim.SGD(s.parameters(), lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-4)
            return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.5)}
        if M == "transformer":
            opt = torch.optim.AdamW(s.parameters(), lr=1e-3, weight_decay=0.01)
            sch = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=3e-3, total_steps=10)
            return {"optimizer": opt, "lr_scheduler": {"scheduler": sch, "interval": "step"}}
        if M == "manual":
            enc = torch.optim.Adam(s.net[:-1].parameters(), lr=1e-3)
            head = torch.optim.SGD(s.net[-1].parameters(), lr=0.05, momentum=0.9)
            return [enc, head], [torch.optim.lr_scheduler.ExponentialLR(enc, 0.9)]
        opt = torch.optim.AdamW(s.parameters(), lr=2e-3)
        return [opt], [torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=4)]

model = Lit()
kw = dict(accelerator="cpu", devices=1, max_steps=3, enable_checkpointing=False, logger=False,
          enable_progress_bar=False, enable_model_summary=False, deterministic=True,
          limit_train_batches=4, limit_val_batches=2, num_sanity_val_steps=0)
if M != "manual":
    kw["accumulate_grad_batches"] = 2
    kw["gradient_clip_val"] = 1.0 if M != "transformer" else 0.5
    kw["gradient_clip_algorithm"] = "value" if M == "transformer" else "norm"
if M == "cnn":
    kw["callbacks"] = [StochasticWeightAveraging(swa_lrs=1e-2, swa_epoch_start=1, annealing_epochs=1),
                       EarlyStopping(monitor="val_loss", patience=3)]
if M == "manual":
    kw["max_steps"] = 6   # manual optimization counts every optimizer's step
if M == "bf16":
    kw["precision"] = "bf16-mixed"
trainer = L.Trainer(**kw)
trainer.fit(model, train_dl, val_dl)
report(policy, [model], train_losses + val_losses)
