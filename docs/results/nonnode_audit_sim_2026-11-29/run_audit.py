"""Run one tools/user_programs program under recompute (budget none) with a PEAKLOG=1-style
peak capture that records more than common.py's: for every block allocated at the highest
allocated point, its size, whether it is a registry node (handle_of(storage._cdata)), and the
op that *allocated* it (views and in-place ops do not overwrite the maker; in-place writers are
kept separately) with its context (grad mode, backward, autograd node, optimizer step, custom
Function, caller frame, ...). Dumps JSON.

usage: python run_audit.py PROGRAM.py OUT.json
"""
import os, sys, json, runpy, collections
import snapimport  # pyalloc from the HEAD snapshot (/tmp/audit/snap)
UP = "/work/main/tools/user_programs"
prog, outp = sys.argv[1], sys.argv[2]
sys.argv = [os.path.join(UP, prog), "recompute", "none"]
sys.path.insert(0, UP)
for k in ("PEAKLOG", "OPLOG", "HELD", "ATTRIB"):
    os.environ.pop(k, None)
import torch
import common  # no Log mode of its own (PEAKLOG unset at import)
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

S = {"pack": 0, "unpack": 0, "opt": 0, "steps": 0, "fn": [], "nops": 0, "eng": None, "budget": 0, "peak": 0,
     "peakcap": None, "shim": None}
maker = {}    # storage data_ptr -> [cdata, info dict, writers Counter]
_schema_cache = {}
THIS = os.path.abspath(__file__)


def writes_of(func):
    w = _schema_cache.get(func)
    if w is None:
        try:
            w = tuple(a.name for a in func._schema.arguments if a.alias_info is not None and a.alias_info.is_write)
        except Exception:
            w = ()
        _schema_cache[func] = w
    return w


def frames():
    f = sys._getframe(2)
    caller = user = uparent = None
    hook = None
    ckpt = False
    n = 0
    while f is not None and n < 80:
        fn = f.f_code.co_filename
        if caller is None and not any(x in fn for x in ("_python_dispatch", "torch/_dynamo", "torch/_compile.py", "torch/utils/_contextlib", "contextlib.py")) and fn != THIS:
            caller = f"{os.path.basename(fn)}:{f.f_code.co_name}:{f.f_lineno}"
        if user is None and fn.startswith(UP) and not fn.endswith("common.py"):
            user = f"{os.path.basename(fn)}:{f.f_code.co_name}:{f.f_lineno}"
            b = f.f_back
            uparent = f"{os.path.basename(b.f_code.co_filename)}:{b.f_code.co_name}" if b is not None else None
        if hook is None and fn.endswith(("torch/nn/modules/module.py", "torch/utils/hooks.py")) and "hook" in f.f_code.co_name:
            hook = f.f_code.co_name
        if fn.endswith("torch/utils/checkpoint.py"): ckpt = True
        if f.f_code.co_name == "__torch_dispatch__" and fn != THIS: S["_subdisp"] = True
        if fn.endswith(("torch/_vmap_internals.py", "torch/_functorch/vmap.py", "torch/_functorch/apis.py")): S["_vm"] = True
        f = f.f_back; n += 1
    return caller, user, hook, uparent, ckpt


def live_blocks():
    snap = S["eng"].snapshot()
    lent = {p[0] for x in snap.get("stitched", []) for p in x.get("pieces", [])}
    return {b["address"]: b["size"] for sg in snap["segments"] for b in sg["blocks"]
            if b["state"] != "inactive" and b["address"] not in lent}


def capture(func, cur):
    from pyalloc import registry
    shim = S["shim"]
    blocks = []
    for a, sz in live_blocks().items():
        m = maker.get(a)
        h = shim.pyalloc_registry_handle_of(m[0]) if m is not None else 0
        flags = ""
        if h:
            try:
                i = registry.Node(h)._info()
                if i.data != a: flags += "otherdata "
                flags += "".join(f"{f} " for f in ("dead", "frozen", "fixed", "evicted") if getattr(i, f))
            except KeyError:
                h = 0
        blocks.append([a, sz, int(h), flags.strip(), dict(m[1]) if m else None,
                       dict(m[2]) if m else None])
    in_bwd = torch._C._current_graph_task_id() != -1
    S["peakcap"] = {"allocated": cur, "op_index": S["nops"], "op": str(func), "in_backward": in_bwd,
                    "opt_steps_done": S["steps"], "blocks": blocks}


class Audit(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if S.get("recheck") and func not in (torch.ops.aten.detach.default, torch.ops.aten.alias.default):
            # the peak op's own results: the registry records them after this mode returns (and
            # after a detach it runs through this mode), so look again at the next other op
            S["recheck"] = False
            pc = S["peakcap"]
            for b in pc["blocks"]:
                m = maker.get(b[0])
                if b[4] is not None and b[4]["opidx"] == pc["op_index"] and m is not None and not b[2]:
                    b[2] = int(S["shim"].pyalloc_registry_handle_of(m[0])); b[3] = (b[3] + " rechecked").strip()
                    if os.environ.get("AUDIT_DEBUG"): print("recheck at", func, b[1], b[2], file=sys.stderr)
        flat = tree_flatten((args, kwargs))[0]
        in_ptrs, any_rg, nin, nested, subc = set(), False, 0, False, False
        for x in flat:
            if isinstance(x, torch.Tensor):
                nin += 1
                any_rg = any_rg or x.requires_grad
                nested = nested or x.is_nested
                subc = subc or type(x) not in (torch.Tensor, torch.nn.Parameter)
                try:
                    if x.layout == torch.strided: in_ptrs.add(x.untyped_storage().data_ptr())
                except Exception:
                    pass
        gm = torch.is_grad_enabled()
        if S.get("first_rg") is None and gm and any_rg: S["first_rg"] = S["nops"] + 1
        out = func(*args, **kwargs)
        S["nops"] += 1
        writes = writes_of(func)
        prev, S["prev"] = S.get("prev"), None
        if writes and prev is not None:  # autograd's clone of an in-place op's original self
            pp, pin, pop = prev
            if pop == "aten.clone.default" and pp in maker and pin & in_ptrs:
                maker[pp][1]["orig_self_for"] = str(func)
        ctx = None
        for t in tree_flatten(out)[0]:
            if not (isinstance(t, torch.Tensor) and t.layout == torch.strided):
                continue
            try:
                st = t.untyped_storage()
                p, nb = st.data_ptr(), st.nbytes()
            except Exception:
                continue
            if nb == 0:
                continue
            if p in in_ptrs:  # a view, an alias, or an in-place/out= write of an input
                if writes and p in maker:
                    maker[p][2][str(func)] += 1
                continue
            if ctx is None:
                S["_subdisp"] = False; S["_vm"] = False
                caller, user, hook, uparent, ckpt = frames()
                try: vm = torch._C._functorch.peek_interpreter_stack() is not None
                except Exception: vm = False
                vm = vm or S["_vm"]
                try:
                    import torch.autograd.forward_ad as _fa
                    fw = _fa._current_level >= 0
                except Exception: fw = False
                node = torch._C._current_autograd_node()
                ctx = {"grad": gm, "inference": torch.is_inference_mode_enabled(), "any_in_rg": any_rg,
                       "n_in": nin, "mut": bool(writes), "bwd": torch._C._current_graph_task_id() != -1,
                       "anode": node.name() if node is not None else None, "opt": S["opt"] > 0,
                       "fn": "/".join(S["fn"]), "caller": caller, "user": user, "hook": hook, "uparent": uparent, "ckpt": ckpt,
                       "pack": S["pack"], "unpack": S["unpack"], "vmap": vm, "fwad": fw, "subdisp": S["_subdisp"] or subc, "nested": nested,
                       "opidx": S["nops"], "step": S["steps"], "op": str(func)}
            d = dict(ctx); d["dtype"] = str(t.dtype).replace("torch.", "")
            try: d["shape"] = list(t.shape)
            except Exception: d["shape"] = ["nested"]
            d["out_rg"] = t.requires_grad; d["nbytes"] = nb
            maker[p] = [st._cdata, d, collections.Counter()]
            S["prev"] = (p, in_ptrs, str(func))
        if S["eng"] is not None:
            cur = S["budget"] - S["eng"].unallocated()
            if cur > S["peak"]:
                S["peak"] = cur
                capture(func, cur)
                S["recheck"] = True
        return out


from torch.optim.optimizer import register_optimizer_step_pre_hook, register_optimizer_step_post_hook
def _pre(o, a, k): S["opt"] += 1
def _post(o, a, k): S["opt"] -= 1; S["steps"] += 1
register_optimizer_step_pre_hook(_pre); register_optimizer_step_post_hook(_post)
_F = torch.autograd.function.Function
_orig_apply = _F.__dict__["apply"].__func__
def _apply(cls, *a, **k):
    S["fn"].append(cls.__name__)
    try:
        return _orig_apply(cls, *a, **k)
    finally:
        S["fn"].pop()
_F.apply = classmethod(_apply)

# saved-tensor hooks (save_on_cpu, checkpoint's recompute in unpack, users' own): flag what their pack/unpack make
_sth = torch.autograd.graph.saved_tensors_hooks
_sth_init = _sth.__init__
def _sth_init_wrapped(self, pack_hook, unpack_hook, *a, **k):
    def pack(t, _p=pack_hook):
        S["pack"] += 1
        try: return _p(t)
        finally: S["pack"] -= 1
    def unpack(x, _u=unpack_hook):
        S["unpack"] += 1
        try: return _u(x)
        finally: S["unpack"] -= 1
    _sth_init(self, pack, unpack, *a, **k)
_sth.__init__ = _sth_init_wrapped

_setup, _report = common.setup, common.report
def setup():
    p = _setup()
    import pyalloc
    from pyalloc import _torch_shim
    S["eng"] = pyalloc._engine(None); S["budget"] = int(S["eng"].stats()["budget_bytes"])
    S["shim"] = _torch_shim.load()
    return p
def report(policy, modules, losses):
    _report(policy, modules, losses)
    import gc
    params = {"param_ptrs": [], "param_shapes": [], "grad_ptrs": [], "opt_ptrs": [], "opt_shapes": [], "buf_ptrs": []}
    for m in modules:
        ps = m.parameters() if hasattr(m, "parameters") else []
        for p in ps:
            try:
                params["param_ptrs"].append(p.untyped_storage().data_ptr()); params["param_shapes"].append(list(p.shape))
                if p.grad is not None and p.grad.layout == torch.strided: params["grad_ptrs"].append(p.grad.untyped_storage().data_ptr())
            except Exception:
                pass
        for b in (m.buffers() if hasattr(m, "buffers") else []):
            try:
                params["buf_ptrs"].append(b.untyped_storage().data_ptr()); params["param_shapes"].append(list(b.shape))
            except Exception:
                pass
    for o in gc.get_objects():
        try:
            if isinstance(o, torch.optim.Optimizer):
                for g in o.param_groups:
                    for p in g["params"]:
                        params["param_ptrs"].append(p.untyped_storage().data_ptr()); params["param_shapes"].append(list(p.shape))
                        if p.grad is not None and p.grad.layout == torch.strided: params["grad_ptrs"].append(p.grad.untyped_storage().data_ptr())
                for st in o.state.values():
                    for v in st.values():
                        if isinstance(v, torch.Tensor) and v.layout == torch.strided and v.numel() > 1:
                            params["opt_ptrs"].append(v.untyped_storage().data_ptr()); params["opt_shapes"].append(list(v.shape))
            elif isinstance(o, torch.nn.Parameter):
                params["param_ptrs"].append(o.untyped_storage().data_ptr()); params["param_shapes"].append(list(o.shape))
        except Exception:
            pass
    with open(outp, "w") as f:
        json.dump({"program": prog, "peak": S["peakcap"], "params": params, "nops": S["nops"], "first_rg": S.get("first_rg"), "pyalloc": __import__("pyalloc").__file__,
                   "opt_steps": S["steps"]}, f)
    print("AUDIT written", outp, "peak", S["peak"])
common.setup, common.report = setup, report

_mode = Audit(); _mode.__enter__()
runpy.run_path(sys.argv[0], run_name="__main__")
