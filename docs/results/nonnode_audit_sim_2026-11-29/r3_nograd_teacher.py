# Pattern: an op under torch.no_grad() that reads only non-nodes (parameters, the input batch):
# a distillation teacher's / DQN target net's / eval forward, kept as the target until backward.
# (Note [What no_grad derives]: recorded only if it reads a registered storage.)
import sys, os; sys.path.insert(0, os.path.dirname(__file__)); from _pre import *
teacher = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 512))
student = torch.nn.Linear(512, 512)
x = torch.randn(1024, 512)
with torch.no_grad():
    t1 = teacher[0](x)             # reads x and parameters only
    t2 = teacher[1](t1)            # reads t1 (not a node)
    t3 = teacher[2](t2)
s = student(x)                     # grad mode: a node
with torch.no_grad():
    d = s * 2                      # no_grad but reads a node: recorded
print("teacher under no_grad: t1", tuple(t1.shape), "node:", node(t1), "| t2 node:", node(t2), "| t3 node:", node(t3))
print("student(x) node:", node(s), "| no_grad s*2 (reads a node) node:", node(d))
