"""The harness of tools/user_programs: each program calls setup() first and report() last.

``python PROGRAM.py POLICY BUDGET``: POLICY ``plain`` runs without pyalloc, ``none`` with
pyalloc and no policy (BUDGET ``none``: 4 GiB), ``recompute``/``swap``/``hybrid`` under that
policy with BUDGET bytes on the simulated device. report() prints the losses (as hex floats)
and a hash of the parameters and buffers, which run.sh compares with plain PyTorch's, then
pyalloc's peak and eviction counts. Debugging aids: ATTRIB=1 prints, at the first
out-of-memory error, what the allocated blocks are (node, pins, dead, frozen) and the stack;
ATTRIB=2 every block that is no node; LAYOUT=1 the segments' layout; OPLOG=1 records which
op made each storage (a Python dispatch mode: slow).
"""
import hashlib, sys, torch
def setup():
    policy, budget = sys.argv[1], sys.argv[2]
    if policy != "plain":
        import pyalloc
        kw = {} if policy == "none" else {"policy": policy}
        if policy in ("swap", "hybrid"): kw["host_pool"] = "1GiB"
        pyalloc.install(device="cpu", budget=int(budget) if budget != "none" else "4GiB", **kw)
    torch.manual_seed(0)
    return policy
def report(policy, modules, losses):
    for l in losses: print("loss", float(l).hex())
    h = hashlib.sha256()
    for m in modules:
        for p in m.parameters(): h.update(torch.view_as_real(p.detach()).contiguous().numpy().tobytes() if p.is_complex() else p.detach().float().contiguous().numpy().tobytes())
        for b in m.buffers(): h.update(b.detach().float().contiguous().numpy().tobytes())
    print("params", h.hexdigest()[:16])
    if policy != "plain":
        import pyalloc
        s = pyalloc.memory_stats()
        print("peak", s["reserved_bytes.all.peak"], "evictions", s.get("remat.evictions", 0),
              "recomputes", s.get("remat.recomputes", 0), "swap_outs", s.get("remat.swap_outs", 0))
import os
def _attrib_hook():
    import pyalloc, traceback
    from pyalloc import registry, oom
    eng = pyalloc._engine(None)
    done = []
    def at_oom(report):
        if done and not os.environ.get("ATTRIB_ALL"): return
        done.append(1); print("OOMREPORT", {k: v for k, v in report.items() if not isinstance(v, (dict, list))}, file=sys.stderr)
        snap = eng.snapshot()
        reg = registry.active()
        bynode = {}
        for h, n in reg.nodes.items():
            i = n._info()
            if i.data: bynode[i.data] = f"{n.op} pins{i.pins}{' frozen' if i.frozen else ''}{' dead' if i.dead else ''}{' fixed' if i.fixed else ''} chain{i.chain}"
        from collections import Counter
        c = Counter()
        lent = {p[0] for x in snap.get("stitched", []) for p in x.get("pieces", [])}
        if os.environ.get("PYALLOC_ORIGINS"):
            for line in open(os.environ["PYALLOC_ORIGINS"]):
                a, n, op, gm, task = line.split()
                _made[int(a, 16)] = (op, round(int(n) / 2**20, 2), "grad" if gm == "1" else "nograd", "task" + task)
        for sg in snap["segments"]:
            for b in sg["blocks"]:
                if b["state"] != "inactive" and b["address"] not in lent:
                    k = ("ev " if b["evictable"] else "   ") + bynode.get(b["address"], "NOT A NODE " + str(_made.get(b["address"], "")))
                    c[k] += b["size"]
                    if os.environ.get("ATTRIB") == "2" and "NOT A NODE" in k: print("   block", hex(b["address"]), b["size"] >> 10, "KiB", sg["segment_type"], file=sys.stderr)
        for k, v in c.most_common(25): print(f"  {v/2**20:8.2f} MiB  {k}", file=sys.stderr)
        if os.environ.get("LAYOUT"):
            for sg in snap["segments"]:
                print("SEG", hex(sg["address"]), sg["total_size"] >> 10, "KiB", sg.get("segment_type"), file=sys.stderr)
                for b in sg["blocks"]:
                    lab = "lent" if b["address"] in lent else ("free" if b["state"] == "inactive" else ("EV " if b["evictable"] else "   ") + bynode.get(b["address"], "NOT A NODE")[:40])
                    print(f"    {b['address'] - sg['address']:>9} {b['size'] >> 10:>6} KiB  {lab}", file=sys.stderr)
        print("".join(traceback.format_stack(limit=8)), file=sys.stderr)
    oom.on_oom(at_oom)
_setup0 = setup
def setup():
    p = _setup0()
    if os.environ.get("ATTRIB") and p not in ("plain", "none"): _attrib_hook()
    return p
_made = {}
def _op_log():
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten
    class Log(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor) and t.untyped_storage().nbytes() > 0:
                    try: _made[t.untyped_storage().data_ptr()] = (str(func), tuple(t.shape), torch.is_grad_enabled())
                    except Exception: pass
            return out
    m = Log(); m.__enter__()
if os.environ.get("OPLOG"): _op_log()
