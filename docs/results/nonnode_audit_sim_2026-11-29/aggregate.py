"""Aggregate /tmp/audit/out/*.json (from run_audit.py): per program, the allocated bytes at the
peak, in nodes and not, and the non-node bytes by kind (activation-like vs parameter / gradient /
optimizer state) and by pattern and aten op. usage: python aggregate.py [out_dir] [--detail PROG]"""
import json, glob, os, sys, re, collections

MiB = 2 ** 20
outdir = sys.argv[1] if len(sys.argv) > 1 and not sys.argv[1].startswith("--") else "/tmp/audit/out"
detail = sys.argv[sys.argv.index("--detail") + 1] if "--detail" in sys.argv else None


def kind_of(addr, info, P, pshapes, pnumels=frozenset(), peak_step=0):
    if addr in P["param"]: return "param"
    if addr in P["grad"]: return "grad"
    if addr in P["opt"]: return "optstate"
    if info is None: return "unknown-origin"
    if info["opt"]: return "optstate"           # made inside optimizer.step()
    if info["anode"] and "AccumulateGrad" in info["anode"]: return "grad"
    sh = tuple(info["shape"])
    if info["bwd"] and info["step"] < peak_step: return "grad"  # survivor of an earlier backward pass
    if info["bwd"] and "nested" not in sh and _numel(sh) in pnumels: return "grad"
    if sh in pshapes and len(sh) > 0:
        return "grad" if info["bwd"] else "param-like"
    return "activation"


def _numel(sh):
    n = 1
    for x in sh: n *= x
    return n


def is_custom_node(name):
    return bool(name) and name.endswith("Backward") and not re.search(r"Backward\d+$", name) and "::" not in name


def pattern_of(size, info, first_rg=None):
    op = info["op"]
    if size < 1024: return "below 1 KiB"
    if info.get("vmap"): return "made under vmap (legacy is_grads_batched / functional.jacobian(vectorize=True) / torch.func.vmap): batched wrappers are foreign"
    if info.get("nested"): return "op on nested (jagged) tensors: foreign"
    if info.get("subdisp"): return "made by an op on a __torch_dispatch__ subclass (result of the subclass's inner ops)"
    if info.get("fwad") and not info["bwd"]: return "forward-mode AD: tangent formulas (op run inside an op on a dual tensor)"
    if info.get("pack"): return "made by a saved-tensor pack hook (kept by autograd as the saved value)"
    if info.get("unpack") or info.get("ckpt"): return "made in checkpoint recompute / unpack hook"
    if info["bwd"]:
        if is_custom_node(info["anode"]): return f"made in backward: custom Function backward"
        if info["hook"] or not (info["caller"] or "").startswith(("graph.py:_engine_run_backward", "__init__.py:backward", "__init__.py:grad")):
            return "made in backward: Python hook/code"
        return "made in backward: autograd formula"
    if info["fn"]: return "made inside custom autograd.Function forward"
    if info["inference"]: return "made under inference_mode"
    if info.get("orig_self_for"): return "ARTIFACT: autograd clone of original self (in-place op), unheard under a dispatch mode"
    if first_rg is not None and info["opidx"] < first_rg:
        return "INPUT: made before the first grad-requiring op (data, constants)"
    if info["n_in"] == 0 and (info["user"] or "").split(":")[1:2] == ["<module>"]:
        return "INPUT: factory op at module level (input data)"
    if not info["grad"]:
        up = info.get("uparent") or ""
        if up.startswith("module.py") and (info["user"] or "").split(":")[1:2] != ["forward"]:
            return "made under no_grad: in a module forward hook"
        return "made under no_grad (reads no node: e.g. teacher/target/eval forward)"
    if info["mut"]: return "op that also writes an input in place"
    if info["n_in"] == 0: return "factory op (no tensor input) in model/loop code"
    if not info["any_in_rg"]: return "no input requires grad (derived from data, not 2x its inputs)"
    if not (info["dtype"].startswith("float") or info["dtype"].startswith("bfloat") or info["dtype"].startswith("complex")):
        return "integer/bool output"
    return "grad mode, requires-grad input, still not a node"


rows, agg_pat, agg_op, agg_patop = [], collections.Counter(), collections.Counter(), collections.Counter()
progs_pat, progs_op, progs_patop = collections.defaultdict(set), collections.defaultdict(set), collections.defaultdict(set)
ex_pat = collections.defaultdict(collections.Counter)
for f in sorted(glob.glob(os.path.join(outdir, "*.json"))):
    d = json.load(open(f))
    pk = d["peak"]
    if pk is None: continue
    pr = d["program"].replace(".py", "")
    pp = d["params"]
    P = {"param": set(pp["param_ptrs"]) | set(pp["buf_ptrs"]), "grad": set(pp["grad_ptrs"]), "opt": set(pp["opt_ptrs"])}
    pshapes = {tuple(s) for s in pp["param_shapes"]} | {tuple(s) for s in pp["opt_shapes"]}
    pshapes |= {tuple(reversed(s)) for s in pp["param_shapes"] if len(s) == 2}
    pnumels = {_numel(s) for s in pp["param_shapes"] if len(s) > 0}
    tot = node = frozen = 0
    kinds, pats, ops = collections.Counter(), collections.Counter(), collections.Counter()
    for addr, size, h, flags, info, writers in pk["blocks"]:
        tot += size
        if h:
            node += size
            if "frozen" in flags: frozen += size
            continue
        k = kind_of(addr, info, P, pshapes, pnumels, pk["opt_steps_done"])
        kinds[k] += size
        if k != "activation": continue
        pat = pattern_of(size, info, d.get("first_rg"))
        if pat.startswith("INPUT"):
            kinds["activation"] -= size; kinds["input-data"] += size
        if pat.startswith("ARTIFACT"):
            kinds["activation"] -= size; kinds["artifact(PEAKLOG mode)"] += size
        op = info["op"]
        if writers and pat not in ("below 1 KiB",):
            pass
        pats[pat] += size; agg_pat[pat] += size
        if not pat.startswith(("INPUT", "ARTIFACT", "below 1 KiB")):
            ops[op] += size; agg_op[op] += size; progs_op[op].add(pr)
        agg_patop[(pat, op)] += size
        progs_pat[pat].add(pr); progs_patop[(pat, op)].add(pr)
        ex_pat[pat][pr] += size
        if detail == pr:
            print(f"  {size/MiB:8.3f} {pat:55s} {op:35s} {info['shape']} {info['dtype']} user={info['user']} caller={info['caller']} anode={info['anode']} fn={info['fn']} step={info['step']} writers={writers}")
    act = kinds["activation"]
    rows.append(dict(prog=pr, alloc=pk["allocated"], tot=tot, node=node, frozen=frozen, nonnode=tot - node, act=act,
                     kinds=kinds, pats=pats, ops=ops, bwd=pk["in_backward"], peakop=pk["op"]))

print(f"{len(rows)} programs")
print("\n== per program (MiB): allocated at peak | in nodes (frozen) | not nodes | non-node activation-like | other non-node kinds | top patterns")
for r in sorted(rows, key=lambda r: -r["act"] / max(r["tot"], 1)):
    oth = ", ".join(f"{k} {v/MiB:.1f}" for k, v in r["kinds"].most_common() if k != "activation")
    tp = "; ".join(f"{k[:60]} {v/MiB:.2f}" for k, v in r["pats"].most_common(5) if not k.startswith(("INPUT", "ARTIFACT")))
    print(f"{r['prog']:30s} {r['tot']/MiB:8.1f} | {r['node']/MiB:7.1f} ({r['frozen']/MiB:.1f}) | {r['nonnode']/MiB:7.1f} | act {r['act']/MiB:7.1f} ({100*r['act']/max(r['tot'],1):4.1f}%) | {oth} | peak in {'bwd' if r['bwd'] else 'fwd'} at {r['peakop']} | {tp}")

print("\n== patterns over activation-like non-node bytes: MiB, programs, top example programs")
for k, v in agg_pat.most_common():
    ex = ", ".join(f"{p} {b/MiB:.1f}" for p, b in ex_pat[k].most_common(3))
    print(f"{v/MiB:9.1f} MiB  {len(progs_pat[k]):3d} progs  {k}  [{ex}]")
print("\n== ops over activation-like non-node bytes (without INPUT, ARTIFACT, below 1 KiB)")
for k, v in agg_op.most_common(30):
    print(f"{v/MiB:9.1f} MiB  {len(progs_op[k]):3d} progs  {k}")
print("\n== (pattern, op)")
for k, v in agg_patop.most_common(45):
    print(f"{v/MiB:9.1f} MiB  {len(progs_patop[k]):3d} progs  {k[0]} | {k[1]}  e.g. {sorted(progs_patop[k])[:4]}")

print("\n== summary table: pattern | MiB | programs (any) | programs with >= 1 MiB | largest example")
for k, v in agg_pat.most_common():
    big = sum(1 for b in ex_pat[k].values() if b >= MiB)
    ex = ex_pat[k].most_common(1)[0]
    print(f"{v/MiB:8.1f} | {len(progs_pat[k]):3d} | {big:3d} | {ex[0]} {ex[1]/MiB:.1f} | {k}")
T = lambda key: sum(r[key] for r in rows)
print(f"\nall programs: allocated at peak {T('tot')/MiB:.0f} MiB, in nodes {T('node')/MiB:.0f}, not nodes {T('nonnode')/MiB:.0f}, of which activation-like {T('act')/MiB:.0f}")
kk = collections.Counter()
for r in rows: kk.update(r["kinds"])
print("non-node kinds over all programs (MiB):", {k: round(v / MiB, 1) for k, v in kk.most_common()})
