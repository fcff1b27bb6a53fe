"""The harness of tools/user_programs: each program calls setup() first and report() last.

``python PROGRAM.py POLICY BUDGET``: POLICY ``plain`` runs without pyalloc, ``none`` with
pyalloc and no policy (BUDGET ``none``: 4 GiB), ``recompute``/``swap``/``hybrid`` under that
policy with BUDGET bytes on the simulated device. report() prints the losses (as hex floats)
and a hash of the parameters and buffers, which run.sh compares with plain PyTorch's, then
pyalloc's peak and eviction counts. Debugging aids: ATTRIB=1 prints, at the first
out-of-memory error, what the allocated blocks are (node, pins, dead, frozen) and the stack;
ATTRIB=2 every block that is no node; LAYOUT=1 the segments' layout; OPLOG=1 records which
op made each storage (a Python dispatch mode: slow).
report() also prints ``allocated peak P end E`` (pyalloc's allocated_bytes.all.peak, and .current
after gc.collect()). Held-memory audit (docs/results/held_audit_sim_2026-11-27.md): HELD=1 prints the registry's resident nodes
by state and op, then calls registry.active().collect() and prints what it freed; HELD=2 also every
allocated block by the op that made it (with OPLOG=1). PEAKLOG=FILE writes the allocated bytes
after every op (implies OPLOG; PEAKLOG=1: only the blocks at the highest point); PEAKAT=N[,M]
dumps the allocated blocks at op N to stderr (PEAKAT_COLLECT=1: then what collect() frees there;
PEAKAT_NODES=1: every registry node there, counted by op and state).
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
              "recomputes", s.get("remat.recomputes", 0), "swap_outs", s.get("remat.swap_outs", 0),
              "leaf_copies", s.get("remat.leaf_copies", 0))
        import gc
        gc.collect()
        s = pyalloc.memory_stats()
        # Allocated (not reserved) bytes: the run's peak, and what is still allocated at the
        # end after gc.collect() (the program's own locals in report()'s caller included).
        print("allocated peak", s["allocated_bytes.all.peak"], "end", s["allocated_bytes.all.current"])
        if os.environ.get("HELD") == "2": _print_by_origin("endblock", _live_blocks())
        if os.environ.get("PEAKLOG"): _peak_report()
        if os.environ.get("HELD"): _held_report(s["allocated_bytes.all.current"])
import os
def _bynode():
    """{data address: a description of its registry node} (resident nodes)."""
    from pyalloc import registry
    reg, bynode = registry.active(), {}
    if reg is None: return bynode
    for h, node in reg.nodes.items():
        i = node._info()
        if i.data: bynode[i.data] = f"node {i.op.decode() or '-'} pins{i.pins} readers{i.readers} chain{i.chain}" + "".join(
            f" {f}" for f in ("dead", "frozen", "fixed", "evicted") if getattr(i, f)) + (" dropped" if not i.key else "")
    return bynode
def _held_report(end):
    """HELD=1: what the registry holds at the end of the run. Resident nodes by state and op
    (dead: only lineage reads them), then the allocated bytes after registry.collect()."""
    import pyalloc
    from pyalloc import registry
    reg = registry.active()
    if reg is None:
        return
    from collections import Counter
    c, n = Counter(), Counter()
    for h, node in reg.nodes.items():
        i = node._info()
        if not i.data or i.evicted:
            continue
        k = ("dead " if i.dead else ("dropped " if not i.key else "live ")) + ("frozen " if i.frozen else "") + i.op.decode()
        c[k] += i.nbytes; n[k] += 1
    for k, v in c.most_common(int(os.environ.get("HELD_TOP", "12"))):
        print(f"held {v/2**20:9.3f} MiB  x{n[k]:<4} {k}")
    bynode = _bynode()
    def blocks():
        snap = pyalloc._engine(None).snapshot()
        lent = {p[0] for x in snap.get("stitched", []) for p in x.get("pieces", [])}
        return {b["address"]: b["size"] for sg in snap["segments"] for b in sg["blocks"]
                if b["state"] != "inactive" and b["address"] not in lent}
    before = blocks()
    reg.collect()
    import gc
    gc.collect()
    after = blocks()
    print("allocated after_collect", pyalloc.memory_stats()["allocated_bytes.all.current"], "before", end)
    freed = sorted(((sz, a) for a, sz in before.items() if after.get(a) != sz), reverse=True)
    for sz, a in freed[:int(os.environ.get("HELD_TOP", "12"))]:
        print(f"freed_by_collect {sz/2**20:9.3f} MiB {hex(a)} {bynode.get(a, 'not a node')} {_made.get(a, '')}")
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
def _live_blocks():
    """The allocated blocks {address: size} (none lent to a stitched block)."""
    import pyalloc
    snap = pyalloc._engine(None).snapshot()
    lent = {p[0] for x in snap.get("stitched", []) for p in x.get("pieces", [])}
    return {b["address"]: b["size"] for sg in snap["segments"] for b in sg["blocks"]
            if b["state"] != "inactive" and b["address"] not in lent}
def _print_by_origin(tag, blocks):
    from collections import Counter
    c, n = Counter(), Counter()
    for a, sz in blocks.items():
        k = str(_made.get(a, "unknown origin")); c[k] += sz; n[k] += 1
    for k, v in sorted(c.items(), key=lambda kv: -kv[1])[:int(os.environ.get("HELD_TOP", "40"))]:
        print(f"{tag} {v/2**20:9.3f} MiB x{n[k]:<4} {k}")
_peak = [0, None]
_budget = [0]
_series = []
_peak_at = [{int(x) for x in os.environ.get('PEAKAT', '0').split(',')}]
def _op_log():
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten
    class Log(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor) and t.layout == torch.strided and t.untyped_storage().nbytes() > 0:
                    try: _made[t.untyped_storage().data_ptr()] = (str(func), tuple(t.shape), torch.is_grad_enabled())
                    except Exception: pass
            if _peak[1] is not None:  # PEAKLOG: the blocks at the highest allocation after an op
                cur = _budget[0] - _peak[1].unallocated()
                _series.append(cur)
                if cur > _peak[0]: _peak[0] = cur; _peak.append(_live_blocks()); del _peak[2:-1]
                if len(_series) in _peak_at[0]:
                    print("PEAKAT op", len(_series), func, "allocated", cur, file=sys.stderr)
                    bn = _bynode()
                    for a, sz in sorted(_live_blocks().items()): print(f"atblock {a:#x} {sz} {_made.get(a, 'unknown origin')} | {bn.get(a, 'not a node')}", file=sys.stderr)
                    if os.environ.get("PEAKAT_NODES"):  # every node by op and state (dead, marked, ...)
                        from collections import Counter
                        from pyalloc import registry
                        c = Counter()
                        for h, n in registry.active().nodes.items():
                            i = n._info()
                            c[(i.op.decode() or "-", *(f for f in ("dead", "evicted", "frozen", "fixed", "marked") if getattr(i, f)), f"readers{i.readers}")] += 1
                        for k, v in sorted(c.items(), key=lambda kv: -kv[1]): print("atnodes", v, *k, file=sys.stderr)
                    if os.environ.get("PEAKAT_COLLECT"):  # what collect() lets go of here: dead lineage
                        from pyalloc import registry
                        before = _live_blocks(); registry.active().collect(); after = _live_blocks()
                        print("PEAKAT collect freed", sum(v for a, v in before.items() if after.get(a) != v), file=sys.stderr)
                        for a, sz in sorted(before.items()):
                            if after.get(a) != sz: print(f"collected {a:#x} {sz} {_made.get(a, 'unknown origin')} | {bn.get(a, 'not a node')}", file=sys.stderr)
            return out
    m = Log(); m.__enter__()
if os.environ.get("OPLOG") or os.environ.get("PEAKLOG"): _op_log()
_setup1 = setup
def setup():
    p = _setup1()
    if os.environ.get("PEAKLOG") and p != "plain":
        import pyalloc
        _peak[1] = pyalloc._engine(None); _budget[0] = int(_peak[1].stats()["budget_bytes"])
    return p
def _peak_report():
    """PEAKLOG=1: the blocks allocated at the highest allocation seen after an op, by the op
    that made them (diff a policy's against none's)."""
    if os.environ.get("PEAKLOG") not in ("1", None):  # a file: the allocation after each op
        with open(os.environ["PEAKLOG"], "w") as f: f.write("\n".join(map(str, _series)))
    if len(_peak) > 2:
        print("peaklog_allocated", _peak[0])
        _print_by_origin("peakblock", _peak[2])
