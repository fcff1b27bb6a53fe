# Untuned: the classic epoch loop. A small CNN classifier with BatchNorm and Dropout, gradient
# accumulation over 3 micro-batches (loss / 3, backward each), clip_grad_norm_, AdamW with a
# StepLR scheduler, loss.item() logged every micro-batch, training accuracy from the held logits
# after optimizer.step(), and a validation pass under model.eval() + torch.no_grad() after each
# optimizer step (then back to model.train()). Validation losses are reported too.
import torch, torch.nn as nn, torch.nn.functional as F
from common import setup, report
policy = setup()
class Net(nn.Module):
    def __init__(self, num_classes=10):
        super().__init__()
        def conv_bn(i, o):
            return nn.Sequential(nn.Conv2d(i, o, 3, padding=1, bias=False), nn.BatchNorm2d(o), nn.ReLU())
        self.stage1 = nn.Sequential(conv_bn(3, 16), conv_bn(16, 16), conv_bn(16, 32))
        self.stage2 = nn.Sequential(conv_bn(32, 64), conv_bn(64, 64), conv_bn(64, 64))
        self.stage3 = nn.Sequential(conv_bn(64, 128), conv_bn(128, 128))
        self.drop2d = nn.Dropout2d(0.1)
        self.dropout = nn.Dropout(0.5)
        self.pool = nn.AdaptiveAvgPool2d(2)
        self.fc1 = nn.Linear(128 * 2 * 2, 256)
        self.fc2 = nn.Linear(256, num_classes)
    def forward(self, x):
        x = F.max_pool2d(self.stage1(x), 2)
        x = F.max_pool2d(self.stage2(x), 2)
        x = self.drop2d(x)
        x = self.pool(self.stage3(x))
        x = torch.flatten(x, 1)
        x = self.dropout(F.relu(self.fc1(x)))
        return self.fc2(x)
model = Net()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=1e-2)
scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
criterion = nn.CrossEntropyLoss()
accum_steps = 3
batch_size = 32
g = torch.Generator().manual_seed(1)
x_val = torch.randn(16, 3, 32, 32, generator=g)
y_val = torch.randint(0, 10, (16,), generator=g)
losses = []
model.train()
for epoch in range(3):
    optimizer.zero_grad()
    running = 0.0
    for i in range(accum_steps):
        x = torch.randn(batch_size, 3, 32, 32, generator=g)
        y = torch.randint(0, 10, (batch_size,), generator=g)
        logits = model(x)
        loss = criterion(logits, y) / accum_steps
        loss.backward()
        running += loss.item()
        losses.append(loss.detach())
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
    optimizer.step()
    scheduler.step()
    train_acc = (logits.argmax(1) == y).float().mean().item()
    model.eval()
    with torch.no_grad():
        val_logits = model(x_val)
        val_loss = criterion(val_logits, y_val)
        val_acc = (val_logits.argmax(1) == y_val).float().mean().item()
    model.train()
    losses.append(val_loss)
    losses.append(torch.tensor(train_acc)); losses.append(torch.tensor(val_acc)); losses.append(torch.tensor(running))
report(policy, [model], losses)
