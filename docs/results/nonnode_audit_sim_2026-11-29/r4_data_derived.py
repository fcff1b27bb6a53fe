# Pattern: with grad mode on, an op on tensors that require no grad (the input batch) whose result
# is less than twice what it reads that is no node: dropout/normalisation/flip/cast of the input
# (Note [What plain inputs derive]'s 2x rule). Autograd then keeps it (the next layer saves it).
import sys, os; sys.path.insert(0, os.path.dirname(__file__)); from _pre import *
import torch.nn.functional as F
lin = torch.nn.Linear(512, 512)
x = torch.randn(1024, 512)
mean, std = x.mean(0), x.std(0)
cases = {
    "F.dropout(x, 0.5)": lambda: F.dropout(x, 0.5, training=True),
    "(x - mean) / std": lambda: (x - mean) / std,
    "x.flip(-1)": lambda: x.flip(-1),
    "x.to(bfloat16)": lambda: x.to(torch.bfloat16),
    "torch.cat([x, x], 1)": lambda: torch.cat([x, x], 1),
    "x[:, None] * x[:, :, None] (outer, >2x)": lambda: x[:64, :, None] * x[:64, None, :],
}
for name, f in cases.items():
    v = f()
    print(f"{name:42s} {str(tuple(v.shape)):16s} node: {node(v)}")
y = lin(F.dropout(x, 0.5, training=True))
print("lin(dropout(x)): output node:", node(y), "| the dropped input saved by addmm:", node(y.grad_fn._saved_mat1))
