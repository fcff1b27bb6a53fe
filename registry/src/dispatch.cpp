// dispatch.cpp — the per-op path: a boxed fallback on a dispatch key the policy's threads
// include, so every aten op of theirs passes through Registry::run_op.
//
// Note [The registry's dispatch key]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// DeferredInit sits above Autograd and Autocast, so the fallback sees each op as the
// program called it, forward and backward. libtorch registers nothing on it; torchdistx's
// deferred_init did, and is the one known clash. Registration happens at run time, not in
// a static initializer: a second fallback on a taken key throws, which at load time would
// abort the process, and here is a catchable error that names the other registration.
// The key is added to the thread-local include set while a policy is on; autograd's worker
// threads get it from the graph task's thread-local state (captured when backward() is
// called), so backward ops come through too. Ops the registry runs itself exclude it
// (Note [The registry's own ops] in own_ops.h).
#include <ATen/Context.h>
#include <ATen/core/grad_mode.h>
#include <c10/core/InferenceMode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <torch/csrc/autograd/forward_grad.h>
#include <torch/csrc/autograd/graph_task.h>
#include <torch/csrc/autograd/variable.h>
#include <ATen/Operators.h>
#include <torch/library.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>

#include "dispatch.h"
#include "own_ops.h"
#include "registry.h"

namespace pyalloc::registry {
namespace {

// Keys on a tensor whose storage is not plain memory of the managed device: subclasses
// and FakeTensor (Python), functorch's wrappers, functionalization. Such tensors are never
// nodes, and an op that takes one is never recorded (run_op).
constexpr c10::DispatchKeySet kCppWrapperKeys({
    c10::DispatchKey::Functionalize,
    c10::DispatchKey::FuncTorchBatched,
    c10::DispatchKey::FuncTorchGradWrapper,
    c10::DispatchKey::BatchedNestedTensor,
    c10::DispatchKey::Batched,
});
constexpr c10::DispatchKeySet kWrapperKeys =
    kCppWrapperKeys | c10::DispatchKeySet(c10::DispatchKey::Python);

void pass_through(const c10::OperatorHandle& op, c10::DispatchKeySet below, torch::jit::Stack* stack) {
  c10::impl::ExcludeDispatchKeyGuard guard(kRegistryKey);
  BelowRegistry below_registry;  // See Note [Re-entry through Python modes] in own_ops.h
  op.redispatchBoxed(below, stack);
}

// Note [What autograd saves]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~
// Autograd's kernel for an in-place op whose backward needs the value it overwrites
// (`a.mul_(b)` needs the old `a` for b's gradient) saves a copy: it calls `self.clone()`
// before running the op below autograd. That clone is an op of its own, called from inside
// the op the registry is running, and it lives until backward uses it: in a GRU cell on
// the CPU, two per timestep. Seen by nobody, it could never leave (the GRU language model
// kept 4 MiB of them in 256 blocks between its activations). So while the registry runs an
// op it keeps listening for the ops autograd's layer calls, and records them like any:
// they are told apart from the op's own kernel, which runs with autograd's keys excluded,
// by those keys still being on. Only for the ops that make such copies, and only where that
// is safe: an in-place op with grad mode on, reading something that requires grad, whose
// write extends a chain the lineage follows (the clone reads the chain's version before the
// write, which stays rebuildable; a write that froze the storage, or one into a storage
// that is not a node, would leave such a reader no way back to what it read), and no Python
// mode on (a mode runs under the dispatch state saved when the op entered, so its ops would
// look the same). Everywhere else the key is excluded for the op: while it is included,
// every op the kernel calls inside (a `to` of a scalar argument in each `mul`) comes through
// the fallback to be passed on, about 1.3k instructions each on the worst-case chain, so
// listening under every op cost more than a quarter of the registry's whole per-op budget.
//
// Note [Tangents forward-mode AD makes]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// An op on a dual tensor (torch.autograd.forward_ad) computes the primal below autograd and
// then, in autograd's layer, the tangent by the op's forward-derivative formula: ops of
// their own (a batch norm's makes half a dozen as large as its input), called from inside
// the op the registry runs, so they were passed through and their results were no nodes.
// A network trained with a JVP regulariser keeps a tangent beside every activation (and
// what double backward through the formulas saves): at 0.7 of its peak a conv net ran out
// of memory with 34 MiB of such storages resident and nothing evictable. So under swap
// and hybrid, while an op that reads a tensor with a tangent runs, the registry also hears
// autograd's layer, and what those ops make is a node without lineage (Note [Backward
// nodes] in backward.cpp): it leaves as a host copy. Not recorded with lineage: a formula
// reads the op's own result (relu's, tanh's, softmax's) before the op returns and that
// result becomes a node, so a recording would keep it as a leaf the eviction then empties.
// Under recompute with spill on (the default; Note [Spilling under recompute] in
// evict.cpp) the same, since such nodes leave through the host pool (the conv net then
// trained bit-identically at 0.4 of its peak). With spill off they stay resident, and the
// out-of-memory report says why and what lets them leave (describe_oom).
constexpr int kHearSaves = 1;     // Note [What autograd saves]
constexpr int kHearTangents = 2;  // Note [Tangents forward-mode AD makes]
thread_local PYALLOC_HOT_TLS int t_autograd_layer_heard = 0;

class HearAutogradLayer {
 public:
  explicit HearAutogradLayer(int on) : was_(t_autograd_layer_heard) { t_autograd_layer_heard = on; }
  ~HearAutogradLayer() { t_autograd_layer_heard = was_; }
  HearAutogradLayer(const HearAutogradLayer&) = delete;
  HearAutogradLayer& operator=(const HearAutogradLayer&) = delete;

 private:
  int was_;
};

// Whether `t` (or the base it views) has a tangent at some forward AD level. Asked of
// every tensor an op reads, so the autograd metadata is read once: a tensor without it has
// no tangent and is no view, and only a view's (`is_view_`) asks for its base, through
// TensorBase::is_view, a virtual call into libtorch (about 40 instructions an op on the
// worst-case chain when it was asked of every tensor).
bool has_tangent(const at::Tensor& t) {
  const auto with = [](const torch::autograd::AutogradMeta* meta) {
    return meta && meta->fw_grad_ && !meta->fw_grad_->empty();
  };
  const torch::autograd::AutogradMeta* meta = torch::autograd::impl::get_autograd_meta(t);
  if (!meta) return false;
  if (with(meta)) return true;
  return meta->is_view_ && t.is_view() &&
         with(torch::autograd::impl::get_autograd_meta(t._base()));
}

bool from_autograd_layer() {
  return t_autograd_layer_heard != 0 &&
         !c10::impl::tls_is_dispatch_key_excluded(c10::DispatchKey::AutogradFunctionality) &&
         c10::impl::TorchDispatchModeTLS::stack_len() == 0;
}

void fallback(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
  const c10::DispatchKeySet below =
      ks & c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER, kRegistryKey);
  Registry& reg = registry();
  if (!reg.active() || (below_registry_depth() > 0 && !from_autograd_layer()))
    return pass_through(op, below, stack);
  const OpInfo& info = op_info(op);
  // See Note [Rebinding a tensor's data].
  if (info.rebinds && stack->size() >= 2) reg.before_rebind(stack->at(stack->size() - 2).toTensor());
  // Not on functorch's or legacy vmap's wrappers: See Note [Composite ops on wrappers].
  if ((ks & kCppWrapperKeys).empty() &&
      (info.composite || (info.autocast_cpu && ks.has(c10::DispatchKey::AutocastCPU)) ||
       (info.autocast_cuda && ks.has(c10::DispatchKey::AutocastCUDA)))) {
    op.redispatchBoxed(below, stack);  // the key stays included: See Note [Composite ops]
    return;
  }
  reg.run_op(op, below, stack, info);
}

// Note [Composite ops on wrappers]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A composite op keeps the key on so that its pieces are seen (Note [Composite ops] in
// op_info.cpp). On a vmap wrapper (functorch's, or legacy vmap's, which
// `autograd.grad(..., is_grads_batched=True)` runs backward under) the pieces run inside
// batching rules, on the physical tensors below the wrapper: legacy vmap's for-loop
// fallback slices, runs the op per slice and `stack`s the results, all of it with the key
// on, so the stacked storage was recorded as a node and held inside a BatchedTensor. The
// next batching rule reads it below the registry, where an eviction had left nothing: an
// input-gradient penalty computed with `is_grads_batched` stopped with the evicted-memory
// error under all three policies. So an op on such a wrapper is foreign like any other:
// run_op restores and pins the plain tensors it reads and passes it through with the key
// off, and nothing inside becomes a node.

// Note [What a subclass's op returns]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// An op on a `__torch_dispatch__` subclass is never recorded: its replay would run the
// subclass's Python again, which may do anything (a DTensor's collectives). But what it
// returns may be plain: a float8 matmul (torchao's, or a user's scaled tensor) returns its
// output upcast, and those outputs, the largest activations of such a model, could never
// leave: a float8 transformer ran out of memory at 0.5 of its peak under every policy with
// 68 MiB of linear outputs resident. Under swap and hybrid a plain result of such an op
// is a node without lineage, which leaves as a host copy, as what backward makes does
// (Note [Backward nodes] in backward.cpp). Not under a dispatch mode (FakeTensor's), and
// not for a view (its storage is the input's).

// Note [Fills of a parameter's shape]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// `torch.full_like(p, 0.1)` reads a tensor that requires grad, so the forward rule took its
// result for an activation and made it a node at once. Adagrad makes its state that way in
// its constructor, with grad mode on: its sums became nodes whose chains followed the
// optimizer's in-place updates until they froze, so under recompute a pointer-generator
// trained with Adagrad ran out of memory at 0.3 of its peak with a report that blamed
// "1.70 MiB in 21 activations [that] can no longer be recomputed" and told the user to drop
// outputs that were the optimizer's state (tools/user_programs/pointer_generator). Under
// recompute such a node could never leave: the optimizer's writes end its lineage, and
// nothing else brings it back. So there a fill that reads no node is remembered as any fill
// is (Note [Fills a write makes activations] below) and becomes a node only when an op that
// may make an activation reads or writes it: optimizer state and buffers made by
// `*_like(parameter)` never do. Under swap and hybrid, and under recompute with spill on
// (the default), it stays a node, which can leave as a host copy: a recommender whose
// Adagrad state is a large part of its memory (tools/user_programs/embedding_bag_sparse)
// trains at 0.5 of its peak under swap and hybrid that way, and ran out of memory when the
// state could not leave. A fill of an activation's shape (`acc = zeros_like(h)` for
// `acc += f(h)`) is a node at once under every policy: it is made where the activations
// are, and a remembered fill that reads a node would hold that node's recording alive for
// nothing.

// Note [Fills a write makes activations]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// `out = torch.zeros(...); out[:, :k] = f(x)` — a buffer filled by a factory, then written
// with activations: a Fourier layer's spectrum, a mixture of experts' outputs, padding. The
// factory reads nothing that requires grad, so the forward rule records nothing, the write
// lands in a storage that is no node (so it cannot be followed), and every op that reads the
// buffer holds it as a leaf: it could never leave, and lineage kept it alive. Making every
// factory's result a node would make parameters and buffers nodes too (a bias made by
// torch.zeros at init, then written by the optimizer). So a fill's result (zeros, ones,
// full, arange, the random factories and their _like and new_ forms; OpInfo::fill), made
// with grad mode on outside backward, is only remembered, with its recording: when an op
// that may make an activation (grad mode on, an input that requires grad) reads or writes
// it, it becomes a node whose first step is the fill, version 0, before that op is looked
// at — so a write extends its chain and a read records a reference. Any other write
// forgets it (its contents are no longer the fill's). `empty` is no fill: what it returns
// is whatever was in memory, which a replay would not reproduce.

// Note [Fills in backward]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// Backward formulas that are no op of their own build a gradient the same way: the
// gradient of max/min/median along a dimension is `at::zeros(sizes).scatter_(dim,
// indices, grad)`, of advanced indexing `at::zeros(sizes).index_put_(indices, grad,
// true)`. The fill reads no tensor, so the per-op path let it pass, the write then landed
// in a storage that was no node, and the gradient — a whole activation's size (a point
// cloud network's max over neighbours: 32 MiB) — could not leave until the pass ended.
// Inside a backward pass under recompute every op that makes a storage is a node (Note
// [Backward nodes] in backward.cpp), and a fill reads nothing that could change: so a
// fill there is recorded like any backward op, and the write extends its chain. (Outside
// backward a fill is only remembered until an activation is written into it: Note [Fills
// a write makes activations] below.)

// Note [What no_grad derives]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// With grad mode off nothing requires grad, so the forward rule records nothing — yet what
// such an op makes from an activation can be an activation too: the forward of a custom
// autograd.Function runs with grad mode off, and what it saves for backward (its output,
// ctx.save_for_backward) lives as long as any saved tensor. A straight-through estimator,
// a fused activation written as a Function, a no_grad projection kept for the loss: none
// of it could ever leave. So an op with grad mode off, outside a backward pass, that reads
// a registered storage is recorded like a forward op; replayed with grad mode off, it
// rebuilds the same bytes (the same rules hold: random ops keep their generator state,
// nondeterministic ones are not recorded). An op that reads only what is not a node
// (parameters, inputs: an EMA teacher's forward, the optimizer's step) is not, so the
// per-op path costs nothing more there. Not under inference mode, whose tensors the
// program does not keep for backward.

// Note [What plain inputs derive]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// With grad mode on, an op that reads nothing that requires grad made no activation by the
// forward rule, yet what it makes is often read by one: an attention mask built per layer
// from the batch's padding (`torch.where(mask, 0, -inf)`, as Hugging Face's models do), an
// adversarial bound `x - eps`, an input normalised or flipped. The op that read it then
// held it as a leaf, strongly, for as long as its own lineage lived: a 2 MiB mask per layer
// kept to the end of backward, which plain PyTorch frees when the layer returns (the held-
// memory audit's cause B: Hugging Face's BERT under gradient checkpointing held 12 MiB more
// than plain PyTorch). So such an op, outside backward and not under inference mode, is
// recorded like a forward op: what it makes is a node, held weakly, which dies when the
// program drops it and is rebuilt from what it read if a replay needs it; the fills it
// reads become nodes first (Note [Fills a write makes activations]). Only where its
// result weighs at least twice what it reads that is no node (record_creation_locked): a
// node keeps what it read alive for as long as its lineage lives, and where the program
// drops those inputs and keeps the result, a result as light as them doubled what plain
// PyTorch holds (TorchScript LSTM cells' stacked outputs: +10 MiB at the peak and +6 MiB
// kept at the end of the run, with "at least what it reads"). An op that writes, views,
// or reads something that requires grad follows its own rule; grad mode off is Note [What
// no_grad derives].

// Note [What a recorded op writes]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// An op that makes an activation may also write arguments that are no node: batch norm's
// running statistics, quantization-aware training's observer (fused_moving_avg_obs_fake_quant
// moves its running min and max towards the batch's, computes a scale from them, and
// quantizes its input with that scale). A replay writes such arguments on copies, so the
// program's state is updated once — but copies of what they hold when it replays, after
// the op updated them: the observer then moves from the moved state, finds another scale,
// and the replayed activation differs from the one the program saw (a QAT network under
// recompute trained to other bits). So the recording keeps a copy of each such argument
// as it was before the op (OpInfo::snapshot), taken right before the op runs, and a
// replay starts from that. Batch norms are left out: in training mode they write the
// running statistics without reading them, in inference mode they read them without
// writing, so a copy per batch norm per step would buy nothing. So are random ops: what
// they write is their draws (rrelu_with_noise's noise, as large as its input), replayed
// from the generator's state. A later write of the argument still settles the op's
// readers (leaf_readers_), which is conservative now.

// The generator a random op draws from: its `generator` argument, else the default one of
// its device.
at::Generator generator_of(c10::ArrayRef<c10::IValue> args, c10::Device device) {
  for (const c10::IValue& v : args)
    if (v.isGenerator()) return v.toGenerator();
  return at::globalContext().defaultGenerator(device);
}

std::mutex g_library_mu;
torch::Library* g_library = nullptr;  // guarded by g_library_mu; never destroyed (as registry())
torch::Library* g_views = nullptr;    // guarded by g_library_mu; never destroyed

// Note [Views without boxing]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A view records nothing and writes nothing; the registry's whole part in it is that its
// source is resident while it runs (`transpose` and `select` go through `as_strided`, whose
// bounds check fails on an evicted storage, which has size 0). Through the boxed fallback
// it still paid the boxing of its arguments (a list for `view`'s sizes), the lock twice
// and the per-op bookkeeping: 150-530 ns an op on the dev VM, where the MLP of small layers
// makes 92 views in its 225 ops a step (`t` of each weight, autograd's `detach`es). The
// views below have kernels of their own on the registry's key, unboxed: they pin the
// source's node (restoring it if evicted) and call the op below the registry, or just call
// it when the source is no node. Whatever reads the view afterwards is an op like any
// other, and is looked at then. Ops that take the view of a subclass, a FakeTensor or a
// nested tensor pass as the fallback passes them. In-place views (`t_`, `squeeze_`) and
// composite ones (`reshape`, whose pieces are seen) stay with the fallback.
template <class Op, class Signature = typename Op::schema>
struct UnboxedView;

template <class Op, class Result, class... Rest>
struct UnboxedView<Op, Result(const at::Tensor&, Rest...)> {
  static Result run(c10::DispatchKeySet ks, const at::Tensor& self, Rest... rest) {
    const c10::DispatchKeySet below =
        ks & c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER, kRegistryKey);
    Registry& reg = registry();
    struct Unpin {
      Registry& reg;
      NodeList nodes;
      ~Unpin() { if (!nodes.empty()) reg.unpin_view_source(nodes); }
    } unpin{reg, {}};
    if (reg.active() && below_registry_depth() == 0 && (self.key_set() & kWrapperKeys).empty() &&
        !self.is_nested())
      reg.pin_view_source(self, &unpin.nodes);
    c10::impl::ExcludeDispatchKeyGuard guard(kRegistryKey);
    BelowRegistry below_registry;
    return Op::redispatch(below, self, std::forward<Rest>(rest)...);
  }
};

// Registered after the fallback; where one cannot be (another library holds a kernel for
// it on the key), that view stays with the fallback.
template <class Op>
void register_view(torch::Library& lib) {
  const c10::OperatorName name(Op::name, Op::overload_name);
  const auto handle = c10::Dispatcher::singleton().findOp(name);
  if (!handle) return;
  const OpInfo& info = op_info(*handle);
  if (!info.aliases_only || !info.written.empty() || info.composite || info.autocast_cpu ||
      info.autocast_cuda || info.rebinds)
    return;
  try {
    const std::string full = c10::toString(name);
    lib.impl(full.c_str(),
             torch::CppFunction::makeFromUnboxedFunction(TORCH_FN(UnboxedView<Op>::run)));
  } catch (const c10::Error&) {
  }
}

void register_views() {
  auto* lib = new torch::Library(torch::Library::IMPL, "aten", kRegistryKey, __FILE__, __LINE__);
  register_view<at::_ops::view>(*lib);
  register_view<at::_ops::t>(*lib);
  register_view<at::_ops::transpose_int>(*lib);
  register_view<at::_ops::detach>(*lib);
  register_view<at::_ops::alias>(*lib);
  register_view<at::_ops::expand>(*lib);
  register_view<at::_ops::permute>(*lib);
  register_view<at::_ops::unsqueeze>(*lib);
  register_view<at::_ops::squeeze>(*lib);
  register_view<at::_ops::squeeze_dim>(*lib);
  register_view<at::_ops::select_int>(*lib);
  register_view<at::_ops::slice_Tensor>(*lib);
  register_view<at::_ops::as_strided>(*lib);
  register_view<at::_ops::unfold>(*lib);
  register_view<at::_ops::diagonal>(*lib);
  register_view<at::_ops::split_Tensor>(*lib);
  register_view<at::_ops::split_with_sizes>(*lib);
  register_view<at::_ops::unbind_int>(*lib);
  g_views = lib;
}

}  // namespace

// Note [Rebinding a tensor's data]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A recording keeps the program's own tensor for an argument that is no node (an input, a
// parameter): nothing is copied, and a write to its storage settles what was recorded from
// it first (invalidate_readers). `x.data = y` writes nothing: it gives the very tensor the
// recording holds another storage. A replay after it read y's contents where the op had
// read x's: under recompute, `keep = relu(lin(x)); x.data = other`, then backward with
// `keep` evicted, gave another lin.weight.grad than plain PyTorch, with no error.
// Python's `.data =` does not call aten::set_data; it calls the autograd hook behind it,
// whose first step is a dispatched aten::_has_compatible_shallow_copy_type(self, new_data)
// (nn.Module._apply asks the same before it rebinds parameters). Both are composites the
// fallback sees, and both count as a write of the storage `self` holds: what was recorded
// from it is restored (that storage still holds what it read) and frozen, before the tensor
// moves. Where the check is asked and no rebinding follows, the settling was unneeded; it
// costs replays, never bits. A node's readers are left alone: they refer to the node's
// storage, not to a tensor, so a rebound activation loses nothing. (Module._apply, weight
// tying and pyalloc's INPLACE_UPDATE rebind parameters between steps, where there is
// seldom anything left to settle.)
void Registry::before_rebind(const at::Tensor& self) {
  const c10::StorageImpl* key = storage_of(self);
  if (!key) return;
  Lock lock(mu_);
  Burial burial(*this, lock);
  if (active_.load(std::memory_order_relaxed)) invalidate_leaf_readers(lock, key);
}

void Registry::pin_view_source(const at::Tensor& self, NodeList* pinned) {
  KeyList keys;
  const auto keep = [&](const at::TensorBase& t) {
    if (const c10::StorageImpl* key = managed_storage_of(t)) keys.push_back(key);
  };
  if (!for_each_sparse_part(self, keep)) keep(self);  // Note [Sparse arguments]
  if (keys.empty()) return;
  Lock lock(mu_);
  Burial burial(*this, lock);
  if (!active_.load(std::memory_order_relaxed)) return;
  ++counters_.ops;
  NodeList nodes;
  for (const c10::StorageImpl* key : keys)
    if (Node* node = by_key_locked(key); node && std::find(nodes.begin(), nodes.end(), node) == nodes.end())
      nodes.push_back(node);
  if (nodes.empty()) return;
  pin_all(lock, nodes);
  *pinned = nodes;
}

void Registry::unpin_view_source(const NodeList& nodes) {
  Lock lock(mu_);
  Burial burial(*this, lock);
  unpin_all_locked(nodes);
}

void Registry::promote_fills_locked(const OpInfo& info, c10::ArrayRef<c10::IValue> arguments) {
  KeyList written;
  for (std::uint16_t pos : info.written)
    if (pos < arguments.size())
      for_each_tensor(arguments[pos], [&](const at::Tensor& t) {
        if (const c10::StorageImpl* key = storage_of(t)) written.push_back(key);
      });
  for (const c10::IValue& v : arguments) {
    for_each_tensor(v, [&](const at::Tensor& t) {
      const c10::StorageImpl* key = storage_of(t);
      if (!key || !fills_.count(key) || by_key_locked(key)) return;
      // A parameter (read whole or through a view): never a node.
      const at::TensorBase& base = t.is_view() ? t._base() : static_cast<const at::TensorBase&>(t);
      if (base.is_leaf() && base.requires_grad()) return forget_fill_locked(key);
      // Written by an op that is not an in-place op on it (batch norm's statistics): the
      // write forgets it.
      const bool writes = std::find(written.begin(), written.end(), key) != written.end();
      if (writes && !info.aliases_only) return;
      promote_fill_locked(key);
    });
  }
}

std::string register_fallback() {
  std::lock_guard<std::mutex> lock(g_library_mu);
  if (g_library) return "";
  watch_deregistrations();
  try {
    auto* lib = new torch::Library(torch::Library::IMPL, "_", kRegistryKey, __FILE__, __LINE__);
    try {
      lib->fallback(torch::CppFunction::makeFromBoxedFunction<&fallback>());
    } catch (...) {
      delete lib;
      throw;
    }
    g_library = lib;
  } catch (const c10::Error& e) {
    return std::string("pyalloc: the registry behind policy=\"recompute\", \"swap\" and \"hybrid\" "
                       "runs on the dispatch key DeferredInit, and another library already "
                       "registered a fallback there (torchdistx's deferred_init does): ") +
           e.what_without_backtrace() +
           ". Do not load that library in this process, or use policy=\"none\" (the "
           "allocator, stitching and the stats work without the registry).";
  }
  // The fallback holds the key: a view that cannot have its own kernel stays with it.
  if (std::getenv("PYALLOC_BOXED_VIEWS") == nullptr) {
    try {
      register_views();
    } catch (const c10::Error&) {
    }
  }
  return "";
}

bool set_thread_enabled(bool on) {
  const bool was = c10::impl::tls_is_dispatch_key_included(kRegistryKey);
  c10::impl::tls_set_dispatch_key_included(kRegistryKey, on);
  return was;
}

void Registry::run_op(const c10::OperatorHandle& op, c10::DispatchKeySet ks,
                      torch::jit::Stack* stack, const OpInfo& info) {
  const std::size_t first = stack->size() - info.num_arguments;
  const c10::ArrayRef<c10::IValue> arguments(stack->data() + first, info.num_arguments);
  // The storages the op reads on the managed device (settings_ is written only by start(),
  // before active_ is set, so it may be read here without the lock).
  KeyList read_keys;
  KeyList sparse_parts;  // the dense parts of sparse arguments (Note [Sparse arguments])
  bool requires_grad = false, foreign = false, sparse = false, python_subclass = false;
  bool dual = false;  // an argument has a tangent (Note [Tangents forward-mode AD makes])
  // A tangent formula's op, heard from autograd's layer inside an op on a dual tensor.
  const bool heard_tangent = (t_autograd_layer_heard & kHearTangents) != 0 &&
                             below_registry_depth() > 0 && from_autograd_layer();
  std::size_t largest_read = 0;  // bytes of the largest storage read
  c10::Device device(settings_.device_type);
  const auto read = [&](const at::TensorBase& t, const c10::StorageImpl* key) {
    if (read_keys.empty()) device = t.device();
    largest_read = std::max(largest_read, key->nbytes());
    read_keys.push_back(key);
  };
  for (const c10::IValue& v : arguments) {
    for_each_tensor(v, [&](const at::Tensor& t) {
      if (!t.defined() || t.unsafeGetTensorImpl()->is_wrapped_number()) return;  // a Python number
      if (C10_UNLIKELY(!(t.key_set() & kWrapperKeys).empty() || t.is_nested())) {
        foreign = true;
        python_subclass = python_subclass || t.key_set().has(c10::DispatchKey::Python);
        return;
      }
      c10::StorageImpl* key = storage_of(t);
      if (C10_UNLIKELY(!key)) {
        if (read_sparse_parts(t, read, &sparse_parts)) {
          sparse = true;
          requires_grad = requires_grad || t.requires_grad();
        }
        return;
      }
      if (t.device().type() != settings_.device_type) return;
      requires_grad = requires_grad || t.requires_grad();
      if (!dual) dual = has_tangent(t);
      read(t, key);
    });
  }
  // A fill to remember (Note [Fills a write makes activations]) reads nothing, or nothing
  // but shapes. (info.fill first: every other op pays one load.)
  const bool fills = info.fill && !foreign && !sparse && at::GradMode::is_enabled() &&
                     torch::autograd::get_current_graph_task_id() == -1 &&
                     !c10::InferenceMode::is_enabled();
  // A fill inside a backward pass is a backward node from the start (Note [Fills in
  // backward]).
  const bool backward_fill = info.fill && !foreign && !sparse && !can_swap_ &&
                             !at::GradMode::is_enabled() &&
                             torch::autograd::get_current_graph_task_id() != -1;
  // A program's own subclass, not a mode's (FakeTensor while torch.compile traces).
  const bool own_subclass = python_subclass && c10::impl::TorchDispatchModeTLS::stack_len() == 0;
  // See Note [What a subclass's op returns].
  const bool subclass_made = own_subclass && can_relocate_ && !info.aliases_only;
  // For the out-of-memory report (describe_oom).
  if (C10_UNLIKELY(own_subclass) && !saw_subclasses_.load(std::memory_order_relaxed))
    saw_subclasses_.store(true, std::memory_order_relaxed);
  if (read_keys.empty() && !fills && !backward_fill && !subclass_made)
    return pass_through(op, ks, stack);
  const std::int64_t task = torch::autograd::get_current_graph_task_id();
  const bool grad_mode = at::GradMode::is_enabled();

  // Outlives the lock: its recording is let go outside it (Note [Releasing outside the
  // lock] in registry.h).
  std::optional<Pending> pending;
  check_interrupt();
  Lock lock(mu_);
  Burial burial(*this, lock);
  if (!active_.load(std::memory_order_relaxed)) {
    lock.unlock();
    return pass_through(op, ks, stack);
  }
  ++counters_.ops;
  // The thread's identity (0 until its first op) and the graph task of its previous op
  // here (one thread-local, initialized statically: Note [Thread-locals on the per-op path]).
  struct ThreadSeen {
    std::uint64_t id;
    std::int64_t task;
  };
  thread_local PYALLOC_HOT_TLS ThreadSeen t_seen{0, -1};
  if (t_seen.id == 0) t_seen.id = thread_hash();
  const std::uint64_t t_thread = t_seen.id;
  const std::int64_t previous_task = std::exchange(t_seen.task, task);
  if (t_thread != owner_thread_ &&
      std::find(seen_threads_.begin(), seen_threads_.end(), t_thread) == seen_threads_.end())
    note_thread_locked(t_thread);
  if (task != -1) {
    enter_backward_locked(task, previous_task);
  } else if (C10_UNLIKELY(!open_tasks_.empty() && t_thread == owner_thread_)) {
    end_stale_backwards_locked(lock);  // passes that ended by an exception
  }
  if (C10_UNLIKELY(dual)) saw_tangents_ = true;  // for the out-of-memory report (describe_oom)
  notice_deaths_locked(/*all=*/false);
  revisit_unread_locked();
  if (C10_UNLIKELY(counters_.ops >= next_sweep_)) sweep_locked(/*tidy=*/true);
  // A sparse argument with a part that is a node makes the op foreign (Note [Sparse
  // arguments]); a part that is a remembered fill stays a leaf.
  if (C10_UNLIKELY(!sparse_parts.empty()) && sparse_parts_read_nodes_locked(sparse_parts))
    foreign = true;
  // Whether the op may make an activation (what else decides is looked at below). One that
  // also takes a subclass, a FakeTensor or a nested tensor is not recorded (its replay
  // could not be trusted), but what it reads of the plain kind is still restored and
  // pinned: the subclass's own ops run below the registry and would read it as it is.
  // Inside a backward pass with grad mode off every op may, under recompute: See Note
  // [Backward nodes].
  const bool may_create =
      !foreign && !heard_tangent && (grad_mode ? requires_grad : task != -1 && !can_swap_);
  // Under swap and hybrid, what a backward pass makes is a node without lineage: See Note
  // [Backward nodes] in backward.cpp.
  // Note [What a subclass's op returns]: a plain result of an op on a Python subclass too.
  // Note [Tangents forward-mode AD makes]: what a tangent formula makes too (and under
  // recompute with spill on).
  const bool bare = subclass_made ||
                    (!foreign && !info.aliases_only &&
                     ((can_swap_ && !grad_mode && task != -1) || (can_relocate_ && heard_tangent)));
  // Whether autograd's layer is heard while this op runs: its tangent formulas.
  const bool hear_tangents = dual && can_relocate_ && !foreign && task == -1 &&
                             c10::impl::TorchDispatchModeTLS::stack_len() == 0;
  // What grad mode derives from tensors that require no grad: a mask, a shifted input. See
  // Note [What plain inputs derive]. (An output is at most eight times its largest input
  // per element here, so smaller inputs cannot make a storage of min_bytes.)
  const bool derives_plain = !foreign && !heard_tangent && grad_mode && !requires_grad && task == -1 &&
                             !info.fill && !info.aliases_only && info.written.empty() &&
                             largest_read * 8 >= settings_.min_bytes &&
                             !c10::InferenceMode::is_enabled();
  // A fill this op reads or writes becomes a node first when the op may make an activation
  // (Note [Fills a write makes activations]).
  if (C10_UNLIKELY(!fills_.empty()) && grad_mode && task == -1 && (requires_grad || derives_plain) &&
      !foreign)
    promote_fills_locked(info, arguments);
  NodeList used;
  for (const c10::StorageImpl* key : read_keys) {
    Node* node = by_key_locked(key);
    if (node && std::find(used.begin(), used.end(), node) == used.end()) used.push_back(node);
  }
  // Most ops of a step read no registered storage, write nothing and make no activation
  // (backward's, the optimizer's on tensors nothing recorded read): nothing to do.
  if (used.empty() && !may_create && info.written.empty() && !floor_probe_ && !fills && !bare &&
      !derives_plain && !hear_tangents) {
    lock.unlock();
    return pass_through(op, ks, stack);
  }

  // 1. What the op reads is restored and pinned.
  PinScope pins(*this);
  const bool in_backward = can_swap_ && task != -1;
  if (!used.empty()) {
    if (in_backward)
      for (Node* node : used) backward_use_locked(node);
    pin_all(lock, used);
    pins.nodes = used;
    if (settings_.policy == Policy::kHybrid && !in_backward) note_forward_uses_locked(used);
    if (in_backward && settings_.prefetch > 0)
      for (Node* node : used) prefetch_after(lock, node);
  }
  // 2. What it writes loses the readers recorded from its old contents, unless the write
  // extends a chain (See Note [Readers of an earlier version] in writes.cpp).
  NodeList targets;
  KeyList written_keys;
  bool parameter_written = false;
  for (std::uint16_t pos : info.written) {
    if (pos >= info.num_arguments) continue;
    for_each_tensor((*stack)[first + pos], [&](const at::Tensor& t) {
      const auto write = [&](const at::TensorBase& part) {
        c10::StorageImpl* key = storage_of(part);
        if (!key || std::find(written_keys.begin(), written_keys.end(), key) != written_keys.end())
          return;
        written_keys.push_back(key);
        Node* node = by_key_locked(key);
        if (!node && !fills_.empty()) forget_fill_locked(key);  // its contents are not the fill's now
        if (node && std::find(targets.begin(), targets.end(), node) == targets.end())
          targets.push_back(node);
        // A node the program made a parameter (`stack(...).detach().requires_grad_()`, as
        // torch.func's stack_module_state does), written by its optimizer: its chain would
        // follow the optimizer's steps while the op that made it reads the member parameters
        // the program later writes back, and a replay then failed its version check. A
        // parameter is no activation: its first write freezes it.
        if (node && t.is_leaf() && t.requires_grad()) parameter_written = true;
      };
      if (!for_each_sparse_part(t, write)) write(t);  // Note [Sparse arguments]
    });
  }
  // 3. What it makes from tensors that require grad is an activation: recorded, unless
  // replaying it would write a registered storage again (then only the write is). The
  // recording is made from the arguments now; the results are added after the op ran.
  const bool replayable =
      !foreign && (!info.nondeterministic || at::globalContext().deterministicAlgorithms());
  const bool writes_node = !targets.empty();
  // See Note [What no_grad derives].
  const bool derives = !grad_mode && task == -1 && !used.empty() && !heard_tangent &&
                       !c10::InferenceMode::is_enabled();
  // Under recompute with spill off, a fill that reads no node is remembered even when
  // what it reads requires grad (`full_like(p, 0.1)` reads a parameter's shape): See Note
  // [Fills of a parameter's shape].
  const bool remembered_only = fills && used.empty() && !can_swap_ && !can_relocate_;
  // Whether what the op returns may become nodes: when it writes no node, or, once the
  // write is known to extend a chain, beside that write (creates_beside, below).
  const bool makes_results = replayable && !remembered_only &&
                             (may_create || derives || derives_plain) && !info.aliases_only;
  const bool creates = makes_results && !writes_node;
  bool extends = writes_node && !parameter_written && extends_chain_locked(targets, replayable);
  const c10::StorageImpl* chained = extends ? targets.front()->key : nullptr;
  for (const c10::StorageImpl* key : written_keys)  // what else it writes first
    if (key != chained) invalidate_readers(lock, key);
  if (extends) {  // a reader of what else it wrote may have been the target
    extends = !targets.front()->frozen;
    invalidate_readers(lock, chained, /*keep=*/extends);
  }
  // What else the op returns, beside a write that extends a chain, is recorded from the
  // same recording: See Note [Fresh results beside a write].
  const bool creates_beside = makes_results && extends;
  const bool remembers = fills && !creates && !writes_node;
  if (creates || extends || remembers) {
    pending.emplace();
    pending->task = task;
    pending->grad_mode = grad_mode;
    pending->plain = derives_plain;
    prepare_locked(op, info, arguments, &*pending);
    if (info.random) {
      at::Generator generator = generator_of(arguments, device);
      std::lock_guard<std::mutex> guard(generator.mutex());
      pending->rec->rng.emplace(generator);  // replayed bit for bit from this state
      pending->rec->generator = generator;
    }
  }
  // See Note [What a recorded op writes].
  c10::SmallVector<std::uint16_t, 4> snapshots;
  if (pending)
    for (std::uint16_t pos : info.snapshot)
      if (pos < pending->rec->args.size() && pending->rec->args[pos].isTensor() &&
          pending->rec->args[pos].toTensor().defined())
        snapshots.push_back(pos);
  const std::uint64_t droppable = C10_UNLIKELY(floor_probe_) ? floor_probe_start_locked(read_keys) : 0;
  std::int64_t elapsed_ns = 0;
  // See Note [What autograd saves].
  const bool hear = extends && written_keys.size() == 1 && requires_grad &&
                    grad_mode && c10::impl::TorchDispatchModeTLS::stack_len() == 0;
  {
    Unlocked unlocked(lock);
    if (C10_UNLIKELY(!snapshots.empty())) snapshot_arguments(*pending->rec, snapshots);
    std::optional<c10::impl::ExcludeDispatchKeyGuard> deaf;
    const int heard = (hear ? kHearSaves : 0) | (hear_tangents ? kHearTangents : 0);
    if (!heard) deaf.emplace(c10::DispatchKeySet(kRegistryKey));
    HearAutogradLayer hear_autograd(heard);
    BelowRegistry below_registry;  // See Note [Re-entry through Python modes] in own_ops.h
    EvictableScope evictable((creates || creates_beside) && places_evictables());  // Note [Evictable placement]
    if (C10_UNLIKELY(settings_.cost == CostModel::kTime)) {
      const std::int64_t start = now_ns();
      op.redispatchBoxed(ks, stack);
      elapsed_ns = now_ns() - start;
    } else {
      op.redispatchBoxed(ks, stack);
    }
  }
  if (C10_UNLIKELY(floor_probe_)) floor_probe_finish_locked(info, droppable);
  // What autograd saved from the chain's version before the write reads an earlier version
  // now (Note [What autograd saves] above; Note [Readers of an earlier version] in writes.cpp).
  if (extends && hear)
    if (Node* target = by_key_locked(chained); target && !target->readers.empty())
      target->stale_readers = true;
  // 4. Recorded after the inputs are unpinned (and so offered to the engine again).
  pins.release();
  if (writes_node) record_mutation_locked(extends ? &*pending : nullptr, targets, elapsed_ns);
  if (creates || creates_beside)
    record_creation_locked(*pending, read_keys, torch::jit::last(*stack, info.num_returns), elapsed_ns);
  if (C10_UNLIKELY(remembers)) remember_fill_locked(*pending, torch::jit::last(*stack, info.num_returns), elapsed_ns);
  if (bare && !writes_node) record_bare_locked(task, read_keys, torch::jit::last(*stack, info.num_returns));
}

// Note [Fresh results beside a write]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// An op that writes a node in place and also returns new tensors: RReLU in training mode
// runs `rrelu_with_noise(input, noise)`, which draws the noise into a buffer its composite
// made by `empty_like(input)` (a node: a fill of an activation's shape) and returns the
// activation. Recorded only as the write, the activation was no node: every RReLU layer's
// output stayed resident, and a self-normalising net with six of them ran out of memory at
// 0.4 of its peak with 7 MiB of them among 19 MiB allocated. When the write extends the
// written node's chain, the recording holds everything a replay of the op needs: its
// Ref to the written node names the version before the write, which a replay rebuilds
// apart from the node (Note [Readers of an earlier version] in writes.cpp), and written
// arguments other than the storage being rebuilt are written on copies (Registry::replay).
// So the new results become nodes of the same recording, after the write is recorded. A
// write the chain cannot follow (the node frozen) leaves them resident as before.

// --- run_op's rare cases, out of its line (Note [The per-op path's footprint]) --------------

template <typename Read>
bool Registry::read_sparse_parts(const at::Tensor& t, Read& read, KeyList* parts) const {
  return for_each_sparse_part(t, [&](const at::Tensor& part) {
    if (const c10::StorageImpl* part_key = managed_storage_of(part)) {
      read(part, part_key);
      parts->push_back(part_key);
    }
  });
}

void Registry::note_thread_locked(std::uint64_t thread) {
  seen_threads_.push_back(thread);
  counters_.backward_threads = static_cast<std::int64_t>(seen_threads_.size());
}

bool Registry::sparse_parts_read_nodes_locked(const KeyList& parts) {
  bool node_read = false;
  for (const c10::StorageImpl* key : parts) {
    if (by_key_locked(key)) node_read = true;
    else if (!fills_.empty()) forget_fill_locked(key);
  }
  return node_read;
}

void Registry::note_forward_uses_locked(const NodeList& used) {
  const std::int64_t now = now_ns();
  const auto waited = static_cast<std::int64_t>(engine_api::api().blocked_ns(engine_));
  for (Node* node : used) {
    node->last_use_ns = now;
    node->waited_ns = waited;
  }
}

std::uint64_t Registry::floor_probe_start_locked(const KeyList& read_keys) {
  std::uint64_t droppable = 0;
  for (const Node* node = nodes_.oldest(); node; node = node->newer) {
    const Node& n = *node;
    if (n.lineage() && !n.evicted && !n.dead && !n.fixed && !n.weak.expired() &&
        std::find(read_keys.begin(), read_keys.end(), n.key) == read_keys.end())
      droppable += n.nbytes;
  }
  engine_api::api().reset_peak_stats(engine_);
  return droppable;
}

void Registry::floor_probe_finish_locked(const OpInfo& info, std::uint64_t droppable) {
  std::uint64_t current = 0, peak = 0;
  engine_api::api().allocated(engine_, &current, &peak);
  if (peak > droppable && peak - droppable > floor_bytes_) {
    floor_bytes_ = peak - droppable;
    floor_allocated_ = peak;
    floor_droppable_ = droppable;
    floor_op_ = info.base + "." + (info.overload.empty() ? "default" : info.overload);
  }
}

void Registry::snapshot_arguments(Recording& rec, c10::ArrayRef<std::uint16_t> positions) {
  OwnOpGuard guard;  // the recording is still this thread's alone
  for (std::uint16_t pos : positions) rec.args[pos] = rec.args[pos].toTensor().clone();
}

}  // namespace pyalloc::registry
