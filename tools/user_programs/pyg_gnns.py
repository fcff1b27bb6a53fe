# Untuned: torch_geometric (PyG) models the way PyG users write them, on synthetic data
# (FakeDataset / FakeHeteroDataset / random graphs, no downloads), 3 Adam steps then an eval pass
# under no_grad, torch.use_deterministic_algorithms(True). MODEL picks the variant:
#   gcn (default): full-batch node classification, two GCNConv (cached=False, normalize) with
#     BatchNorm, dropout_edge in training, dropout, cross-entropy on a train mask.
#   gatv2: GATv2Conv, 4 heads with attention (edge) dropout, concat, then a 1-head GATv2Conv;
#     LayerNorm; edge features (edge_dim) from the graph.
#   sage: full-batch SAGEConv (mean, max and lstm-free "sum" aggregations) with GraphNorm and
#     JumpingKnowledge("cat"), residual connections.
#   gin: graph classification, GINConv(MLP) x3 with BatchNorm, global_add_pool, over a
#     torch_geometric.loader.DataLoader of a FakeDataset (batches of 16 graphs, shuffled).
#   gine: GINEConv with edge attributes, GraphNorm, AttentionalAggregation (global attention) pooling.
#   transformer: TransformerConv (heads, edge_dim, beta=True, attention dropout), global_mean_pool
#     plus global_max_pool, graph classification.
#   gps: GraphGPS layers (GPSConv around GINEConv, multihead attention over to_dense_batch),
#     graph classification with Set2Set readout.
#   pna: PNAConv with mean/min/max/std aggregators, identity/amplification/attenuation scalers,
#     the degree histogram computed from the training graphs, edge_dim, towers.
#   hetero: to_hetero(GraphSAGE with SAGEConv((-1, -1)), metadata, aggr="sum") on a
#     FakeHeteroDataset (lazy parameters initialised by a first forward under no_grad).
#   rgcn: RGCNConv with num_bases on the homogeneous form of a FakeHeteroDataset (edge types).
#   custom: a MessagePassing subclass of one's own: gated messages (message() with x_i, x_j,
#     edge_attr, index, ptr, size_i: softmax over incoming edges), aggregate() overridden with a
#     scatter-sum plus scatter-max (torch_geometric.utils.scatter), update() with a GRU cell.
#   edgeconv: EdgeConv (static edge_index; DynamicEdgeConv needs torch_cluster, absent) on point
#     clouds batched by the DataLoader, global_max_pool.
import os
import torch, torch.nn as nn, torch.nn.functional as F
from common import setup, report
policy = setup()
import torch_geometric
torch_geometric.seed_everything(0)   # FakeDataset draws sizes and graph labels from Python random
torch.use_deterministic_algorithms(True)
import torch_geometric
from torch_geometric.datasets import FakeDataset, FakeHeteroDataset
from torch_geometric.loader import DataLoader
from torch_geometric.utils import dropout_edge, degree, softmax, scatter
import torch_geometric.nn as gnn
M = os.environ.get("MODEL", "gcn")
losses = []

def node_data(edge_dim=0):
    ds = FakeDataset(num_graphs=1, avg_num_nodes=2000, avg_degree=10, num_channels=48,
                     edge_dim=edge_dim, num_classes=6, task="node")
    d = ds[0]
    g = torch.Generator().manual_seed(2)
    d.train_mask = torch.rand(d.num_nodes, generator=g) < 0.6
    return d

def graph_loader(edge_dim=0, n=48, nodes=40):
    ds = FakeDataset(num_graphs=n, avg_num_nodes=nodes, avg_degree=6, num_channels=32,
                     edge_dim=edge_dim, num_classes=4, task="graph")
    return ds, DataLoader(ds, batch_size=16, shuffle=True, generator=torch.Generator().manual_seed(3))

def train_node(model, d, fwd, steps=3, lr=5e-3):
    opt = torch.optim.Adam(model.parameters(), lr=lr, weight_decay=5e-4)
    for _ in range(steps):
        model.train(); opt.zero_grad()
        out = fwd(d)
        loss = F.cross_entropy(out[d.train_mask], d.y[d.train_mask])
        loss.backward(); opt.step()
        losses.append(loss.detach())
    model.eval()
    with torch.no_grad():
        out = fwd(d)
        losses.append((out.argmax(-1) == d.y)[~d.train_mask].float().mean()); losses.append(out.square().sum())

def train_graph(model, loader, fwd, lr=3e-3):
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    model.train()
    for b in loader:                       # 48 graphs / 16 = 3 steps
        opt.zero_grad()
        out = fwd(b)
        loss = F.cross_entropy(out, b.y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 2.0)
        opt.step()
        losses.append(loss.detach())
    model.eval()
    with torch.no_grad():
        for b in DataLoader(loader.dataset, batch_size=24):
            losses.append(fwd(b).square().sum())

if M == "gcn":
    d = node_data()
    class Net(nn.Module):
        def __init__(s):
            super().__init__()
            s.c1 = gnn.GCNConv(48, 128); s.bn = nn.BatchNorm1d(128); s.c2 = gnn.GCNConv(128, 6)
        def forward(s, x, ei):
            if s.training: ei, _ = dropout_edge(ei, p=0.2, force_undirected=True)
            x = F.dropout(x, 0.3, s.training)
            x = F.relu(s.bn(s.c1(x, ei)))
            x = F.dropout(x, 0.5, s.training)
            return s.c2(x, ei)
    model = Net()
    train_node(model, d, lambda d: model(d.x, d.edge_index))
elif M == "gatv2":
    d = node_data(edge_dim=4)
    class Net(nn.Module):
        def __init__(s):
            super().__init__()
            s.c1 = gnn.GATv2Conv(48, 32, heads=4, dropout=0.3, edge_dim=4)
            s.ln = nn.LayerNorm(128)
            s.c2 = gnn.GATv2Conv(128, 6, heads=1, concat=False, dropout=0.3, edge_dim=4)
        def forward(s, x, ei, ea):
            x = F.dropout(x, 0.2, s.training)
            x = F.elu(s.ln(s.c1(x, ei, ea)))
            x = F.dropout(x, 0.2, s.training)
            return s.c2(x, ei, ea)
    model = Net()
    train_node(model, d, lambda d: model(d.x, d.edge_index, d.edge_attr))
elif M == "sage":
    d = node_data()
    class Net(nn.Module):
        def __init__(s):
            super().__init__()
            s.inp = nn.Linear(48, 96)
            s.convs = nn.ModuleList([gnn.SAGEConv(96, 96, aggr=a) for a in ("mean", "max", "sum")])
            s.norms = nn.ModuleList([gnn.GraphNorm(96) for _ in range(3)])
            s.jk = gnn.JumpingKnowledge("cat"); s.out = nn.Linear(96 * 3, 6)
        def forward(s, x, ei):
            x = s.inp(x); xs = []
            for c, n in zip(s.convs, s.norms):
                x = x + F.dropout(F.relu(n(c(x, ei))), 0.3, s.training)
                xs.append(x)
            return s.out(s.jk(xs))
    model = Net()
    train_node(model, d, lambda d: model(d.x, d.edge_index))
elif M == "gin":
    ds, loader = graph_loader()
    def mlp(i, o): return nn.Sequential(nn.Linear(i, o), nn.BatchNorm1d(o), nn.ReLU(), nn.Linear(o, o))
    class Net(nn.Module):
        def __init__(s):
            super().__init__()
            s.convs = nn.ModuleList([gnn.GINConv(mlp(32 if i == 0 else 64, 64), train_eps=True) for i in range(3)])
            s.bns = nn.ModuleList([nn.BatchNorm1d(64) for _ in range(3)])
            s.head = nn.Sequential(nn.Linear(64 * 3, 64), nn.ReLU(), nn.Dropout(0.5), nn.Linear(64, 4))
        def forward(s, x, ei, batch):
            hs = []
            for c, b in zip(s.convs, s.bns):
                x = F.relu(b(c(x, ei))); hs.append(gnn.global_add_pool(x, batch))
            return s.head(torch.cat(hs, -1))
    model = Net()
    train_graph(model, loader, lambda b: model(b.x, b.edge_index, b.batch))
elif M == "gine":
    ds, loader = graph_loader(edge_dim=6)
    class Net(nn.Module):
        def __init__(s):
            super().__init__()
            s.inp = nn.Linear(32, 64)
            s.convs = nn.ModuleList([gnn.GINEConv(nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64)), edge_dim=6) for _ in range(3)])
            s.norms = nn.ModuleList([gnn.GraphNorm(64) for _ in range(3)])
            s.pool = gnn.AttentionalAggregation(gate_nn=nn.Sequential(nn.Linear(64, 32), nn.Tanh(), nn.Linear(32, 1)),
                                                nn=nn.Linear(64, 64))
            s.out = nn.Linear(64, 4)
        def forward(s, x, ei, ea, batch):
            x = s.inp(x)
            for c, n in zip(s.convs, s.norms):
                x = x + F.dropout(F.relu(n(c(x, ei, ea), batch)), 0.2, s.training)
            return s.out(s.pool(x, batch))
    model = Net()
    train_graph(model, loader, lambda b: model(b.x, b.edge_index, b.edge_attr, b.batch))
elif M == "transformer":
    ds, loader = graph_loader(edge_dim=5)
    class Net(nn.Module):
        def __init__(s):
            super().__init__()
            s.c1 = gnn.TransformerConv(32, 16, heads=4, edge_dim=5, beta=True, dropout=0.2)
            s.c2 = gnn.TransformerConv(64, 16, heads=4, edge_dim=5, beta=True, dropout=0.2)
            s.ln1 = nn.LayerNorm(64); s.ln2 = nn.LayerNorm(64); s.out = nn.Linear(128, 4)
        def forward(s, x, ei, ea, batch):
            x = F.gelu(s.ln1(s.c1(x, ei, ea)))
            x = x + F.gelu(s.ln2(s.c2(x, ei, ea)))
            return s.out(torch.cat([gnn.global_mean_pool(x, batch), gnn.global_max_pool(x, batch)], -1))
    model = Net()
    train_graph(model, loader, lambda b: model(b.x, b.edge_index, b.edge_attr, b.batch))
elif M == "gps":
    ds, loader = graph_loader(edge_dim=8)
    class Net(nn.Module):
        def __init__(s):
            super().__init__()
            s.inp = nn.Linear(32, 64); s.edge = nn.Linear(8, 64)
            s.layers = nn.ModuleList([gnn.GPSConv(64, gnn.GINEConv(nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64))),
                                                  heads=4, dropout=0.1, attn_type="multihead", attn_kwargs={"dropout": 0.1})
                                      for _ in range(2)])
            s.readout = gnn.Set2Set(64, processing_steps=3); s.out = nn.Linear(128, 4)
        def forward(s, x, ei, ea, batch):
            x = s.inp(x); ea = s.edge(ea)
            for l in s.layers: x = l(x, ei, batch, edge_attr=ea)
            return s.out(s.readout(x, batch))
    model = Net()
    train_graph(model, loader, lambda b: model(b.x, b.edge_index, b.edge_attr, b.batch))
elif M == "pna":
    ds, loader = graph_loader(edge_dim=4)
    maxd = -1
    for dd in ds:
        maxd = max(maxd, int(degree(dd.edge_index[1], num_nodes=dd.num_nodes, dtype=torch.long).max()))
    deg = torch.zeros(maxd + 1, dtype=torch.long)
    for dd in ds:
        deg += torch.bincount(degree(dd.edge_index[1], num_nodes=dd.num_nodes, dtype=torch.long), minlength=deg.numel())
    class Net(nn.Module):
        def __init__(s):
            super().__init__()
            s.inp = nn.Linear(32, 60)
            s.convs = nn.ModuleList([gnn.PNAConv(60, 60, aggregators=["mean", "min", "max", "std"],
                                                 scalers=["identity", "amplification", "attenuation"], deg=deg,
                                                 edge_dim=4, towers=3, pre_layers=1, post_layers=1, divide_input=False)
                                     for _ in range(2)])
            s.bns = nn.ModuleList([nn.BatchNorm1d(60) for _ in range(2)])
            s.out = nn.Sequential(nn.Linear(60, 30), nn.ReLU(), nn.Linear(30, 4))
        def forward(s, x, ei, ea, batch):
            x = s.inp(x)
            for c, b in zip(s.convs, s.bns): x = F.relu(b(c(x, ei, ea)))
            return s.out(gnn.global_add_pool(x, batch))
    model = Net()
    train_graph(model, loader, lambda b: model(b.x, b.edge_index, b.edge_attr, b.batch))
elif M == "hetero":
    ds = FakeHeteroDataset(num_graphs=1, num_node_types=3, num_edge_types=6, avg_num_nodes=600,
                           avg_degree=8, avg_num_channels=32, num_classes=5, task="node")
    data = ds[0]
    nt0 = data.node_types[0]
    g = torch.Generator().manual_seed(2)
    mask = torch.rand(data[nt0].num_nodes, generator=g) < 0.6
    class GNN(nn.Module):
        def __init__(s):
            super().__init__()
            s.c1 = gnn.SAGEConv((-1, -1), 64); s.drop = nn.Dropout(0.3); s.c2 = gnn.SAGEConv((-1, -1), 5)
        def forward(s, x, edge_index):   # to_hetero finds the edge input by this name
            return s.c2(s.drop(F.relu(s.c1(x, edge_index))), edge_index)
    model = gnn.to_hetero(GNN(), data.metadata(), aggr="sum")
    with torch.no_grad(): model(data.x_dict, data.edge_index_dict)   # lazy init
    opt = torch.optim.Adam(model.parameters(), lr=5e-3)
    for _ in range(3):
        model.train(); opt.zero_grad()
        out = model(data.x_dict, data.edge_index_dict)[nt0]
        loss = F.cross_entropy(out[mask], data[nt0].y[mask])
        loss.backward(); opt.step(); losses.append(loss.detach())
    model.eval()
    with torch.no_grad(): losses.append(sum(v.square().sum() for v in model(data.x_dict, data.edge_index_dict).values()))
elif M == "rgcn":
    ds = FakeHeteroDataset(num_graphs=1, num_node_types=2, num_edge_types=5, avg_num_nodes=800,
                           avg_degree=8, avg_num_channels=24, num_classes=5, task="node")
    het = ds[0]
    for nt in het.node_types:   # same feature width everywhere for to_homogeneous
        het[nt].x = het[nt].x[:, :16] if het[nt].x.shape[1] >= 16 else F.pad(het[nt].x, (0, 16 - het[nt].x.shape[1]))
        if "y" not in het[nt]: het[nt].y = torch.full((het[nt].num_nodes,), -100, dtype=torch.long)
    d = het.to_homogeneous()
    R = int(d.edge_type.max()) + 1
    g = torch.Generator().manual_seed(2)
    d.train_mask = (torch.rand(d.num_nodes, generator=g) < 0.6) & (d.y >= 0)
    class Net(nn.Module):
        def __init__(s):
            super().__init__()
            s.c1 = gnn.RGCNConv(16, 64, R, num_bases=3); s.c2 = gnn.RGCNConv(64, 5, R, num_bases=3)
        def forward(s, x, ei, et):
            return s.c2(F.dropout(F.relu(s.c1(x, ei, et)), 0.3, s.training), ei, et)
    model = Net()
    train_node(model, d, lambda d: model(d.x, d.edge_index, d.edge_type))
elif M == "custom":
    d = node_data(edge_dim=3)
    class GatedConv(gnn.MessagePassing):
        def __init__(self, c, ed):
            super().__init__(aggr=None, node_dim=0)
            self.q = nn.Linear(c, c); self.k = nn.Linear(c, c); self.v = nn.Linear(c, c); self.e = nn.Linear(ed, c)
            self.gru = nn.GRUCell(2 * c, c)
        def forward(self, x, ei, ea):
            return self.propagate(ei, x=x, edge_attr=ea)
        def message(self, x_i, x_j, edge_attr, index, ptr, size_i):
            e = self.e(edge_attr)
            a = (self.q(x_i) * (self.k(x_j) + e)).sum(-1, keepdim=True) / x_i.shape[-1] ** 0.5
            a = softmax(a, index, ptr, size_i)
            a = F.dropout(a, 0.2, self.training)
            return a * (self.v(x_j) + e)
        def aggregate(self, inputs, index, ptr=None, dim_size=None):
            return torch.cat([scatter(inputs, index, 0, dim_size, "sum"), scatter(inputs, index, 0, dim_size, "max")], -1)
        def update(self, aggr_out, x):
            return self.gru(aggr_out, x)
    class Net(nn.Module):
        def __init__(s):
            super().__init__()
            s.inp = nn.Linear(48, 64); s.c1 = GatedConv(64, 3); s.c2 = GatedConv(64, 3); s.out = nn.Linear(64, 6)
        def forward(s, x, ei, ea):
            x = F.relu(s.inp(x)); x = s.c1(x, ei, ea); x = s.c2(F.dropout(x, 0.2, s.training), ei, ea)
            return s.out(x)
    model = Net()
    train_node(model, d, lambda d: model(d.x, d.edge_index, d.edge_attr))
elif M == "edgeconv":
    ds, loader = graph_loader(nodes=64)
    class Net(nn.Module):
        def __init__(s):
            super().__init__()
            s.c1 = gnn.EdgeConv(nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64)), aggr="max")
            s.c2 = gnn.EdgeConv(nn.Sequential(nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, 64)), aggr="mean")
            s.out = nn.Sequential(nn.Linear(128, 64), nn.ReLU(), nn.Dropout(0.3), nn.Linear(64, 4))
        def forward(s, x, ei, batch):
            x1 = s.c1(x, ei); x2 = s.c2(x1, ei)
            return s.out(gnn.global_max_pool(torch.cat([x1, x2], -1), batch))
    model = Net()
    train_graph(model, loader, lambda b: model(b.x, b.edge_index, b.batch))
else:
    raise SystemExit(f"unknown MODEL {M}")
report(policy, [model], losses)
