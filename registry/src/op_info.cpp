// op_info.cpp — working out and caching OpInfo.
#include "op_info.h"
#include "own_ops.h"  // PYALLOC_HOT_TLS

#include <ATen/core/enum_tag.h>
#include <c10/util/flat_hash_map.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <unordered_set>

namespace pyalloc::registry {
namespace {

// Ops whose schema does not say that they write some arguments: PyTorch's batch norms
// update the running statistics (arguments 3 and 4) in place. Replaying them must not
// write those again, and writing them must invalidate what was recorded from them.
bool undeclared_running_stats(const std::string& name) {
  static const char* const kNames[] = {"aten::native_batch_norm", "aten::_native_batch_norm_legit",
                                       "aten::_batch_norm_with_update", "aten::cudnn_batch_norm",
                                       "aten::miopen_batch_norm"};
  return std::any_of(std::begin(kNames), std::end(kNames),
                     [&](const char* n) { return name == n; });
}

Flops flops_kind(const std::string& name) {
  if (name == "aten::mm" || name == "aten::bmm") return Flops::kMatmul;
  if (name == "aten::addmm" || name == "aten::baddbmm") return Flops::kMatmulWithBias;
  if (name == "aten::convolution" || name == "aten::_convolution" ||
      name == "aten::cudnn_convolution")
    return Flops::kConvolution;
  return Flops::kNone;
}

std::unique_ptr<OpInfo> compute(const c10::OperatorHandle& op) {
  auto info = std::make_unique<OpInfo>();
  const c10::FunctionSchema& schema = op.schema();
  const std::string& base = schema.name();
  info->base = base;
  info->overload = schema.overload_name();
  // Note [Composite ops]
  // ~~~~~~~~~~~~~~~~~~~~
  // The fallback sits above Autograd, so it sees an op before autograd decomposes it. A
  // CompositeImplicitAutograd op (linear, dropout, layer_norm) has no kernel of its own
  // below: it runs as calls to other ops, and what those make (dropout's mask, linear's
  // matmul output) is what autograd saves. So for such an op the key stays included and
  // the pieces come back through the fallback one by one; only leaf ops are recorded.
  // Autocast works the same way: its kernel casts the inputs and calls the op again, so
  // an op with an autocast kernel is passed through while autocast is on, and both the
  // casts and the op proper come back as leaves.
  //
  // Which kernel runs at the Autograd keys follows PyTorch's precedence
  // (OperatorEntry::computeDispatchTableEntry): a kernel registered to the backend or to
  // CompositeExplicitAutograd wins, then the CompositeImplicitAutograd "math" kernel, and
  // only then one registered to the Autograd alias. So an op with a math kernel is
  // composite unless a backend or explicit kernel stands before it — matmul and linear
  // have an Autograd-alias kernel too, never used for dense tensors, and their pieces
  // (bmm, addmm, the clones a reshape makes) are what autograd saves.
  info->composite =
      op.hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd) &&
      !op.hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutograd) &&
      !op.hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutogradNonFunctional) &&
      !op.hasKernelForDispatchKey(c10::DispatchKey::CPU) &&
      !op.hasKernelForDispatchKey(c10::DispatchKey::CUDA);
  info->rebinds = base == "aten::set_data" || base == "aten::_has_compatible_shallow_copy_type";
  info->autocast_cpu = op.hasKernelForDispatchKey(c10::DispatchKey::AutocastCPU);
  info->autocast_cuda = op.hasKernelForDispatchKey(c10::DispatchKey::AutocastCUDA);
  info->random = op.hasTag(at::Tag::nondeterministic_seeded);
  info->nondeterministic = op.hasTag(at::Tag::nondeterministic_bitwise);
  const auto& args = schema.arguments();
  info->num_arguments = static_cast<std::uint16_t>(args.size());
  info->num_returns = static_cast<std::uint16_t>(schema.returns().size());
  for (std::size_t i = 0; i < args.size(); ++i) {
    const c10::AliasInfo* alias = args[i].alias_info();
    if (alias && alias->isWrite()) info->written.push_back(static_cast<std::uint16_t>(i));
  }
  const bool batch_norm = undeclared_running_stats(base);
  // (A random op writes its draws there: rrelu_with_noise's noise, as large as its input.)
  if (!batch_norm && !info->random) info->snapshot = info->written;
  if (batch_norm) {
    for (std::uint16_t i : {3, 4}) {
      if (i < args.size() && std::find(info->written.begin(), info->written.end(), i) ==
                                 info->written.end())
        info->written.push_back(i);
    }
    // Found by name: _native_batch_norm_legit.no_stats has a bool and a float at 3 and 4.
    for (std::size_t i = 0; i < args.size(); ++i) {
      if (args[i].name() == "running_mean" || args[i].name() == "running_var")
        info->running_stats.push_back(static_cast<std::uint16_t>(i));
      if (args[i].name() == "training" && args[i].type()->kind() == c10::TypeKind::BoolType)
        info->training_arg = static_cast<std::int16_t>(i);
    }
    // Without a training flag only _batch_norm_with_update always trains.
    if (info->training_arg < 0 && base != "aten::_batch_norm_with_update") info->running_stats.clear();
  }
  const auto& returns = schema.returns();
  info->aliases_only = !returns.empty() && std::all_of(returns.begin(), returns.end(),
                                                       [](const c10::Argument& r) {
                                                         return r.alias_info() != nullptr;
                                                       });
  info->flops = flops_kind(base);
  static const std::unordered_set<std::string> kFills = {
      "aten::zeros",     "aten::ones",       "aten::full",        "aten::arange",
      "aten::linspace",  "aten::logspace",   "aten::eye",         "aten::scalar_tensor",
      "aten::rand",      "aten::randn",      "aten::randint",     "aten::randperm",
      "aten::zeros_like", "aten::ones_like", "aten::full_like",   "aten::rand_like",
      "aten::randn_like", "aten::randint_like", "aten::new_zeros", "aten::new_ones",
      "aten::new_full"};
  info->fill = !info->aliases_only && info->num_returns == 1 && kFills.count(base) != 0;
  return info;
}

// One table for the process, read through a per-thread cache so the common case takes no
// lock and compares no names. Keyed by the schema's address, which is stable while the
// operator is registered. An operator deregistered at run time (a torch.library with a
// finite lifetime) could leave its address to another, so a deregistration bumps an epoch
// that empties every thread's cache, and the table itself checks names on its (slow) path.
// Entries are never destroyed: a thread may still hold one until its next lookup.
std::mutex g_table_mu;
std::unordered_multimap<const void*, std::unique_ptr<OpInfo>> g_table;  // guarded by g_table_mu
std::atomic<std::uint64_t> g_epoch{0};

class DeregistrationListener final : public c10::OpRegistrationListener {
 public:
  void onOperatorRegistered(const c10::OperatorHandle&) override {}
  void onOperatorDeregistered(const c10::OperatorHandle&) override {
    g_epoch.fetch_add(1, std::memory_order_release);
  }
};

bool names(const OpInfo& info, const c10::FunctionSchema& schema) {
  return info.base == schema.name() && info.overload == schema.overload_name();
}

}  // namespace

void watch_deregistrations() {
  static const bool once = [] {
    // Kept for the life of the process, as the registry is.
    new c10::RegistrationHandleRAII(c10::Dispatcher::singleton().addRegistrationListener(
        std::make_unique<DeregistrationListener>()));
    return true;
  }();
  (void)once;
}

const OpInfo& op_info(const c10::OperatorHandle& op) {
  struct Cache {
    ska::flat_hash_map<const void*, const OpInfo*> map;
    std::uint64_t epoch = 0;
  };
  thread_local Cache cache;
  // The last op asked about, before the map: most ops repeat the one before (a chain of
  // elementwise ops, then their gradients).
  thread_local PYALLOC_HOT_TLS const void* t_last_key = nullptr;
  thread_local PYALLOC_HOT_TLS const OpInfo* t_last = nullptr;
  const c10::FunctionSchema& schema = op.schema();
  const void* key = &schema;
  const std::uint64_t epoch = g_epoch.load(std::memory_order_acquire);
  if (cache.epoch != epoch) {
    cache.map.clear();
    cache.epoch = epoch;
    t_last_key = nullptr;
  }
  if (key == t_last_key) return *t_last;
  auto it = cache.map.find(key);
  if (it != cache.map.end()) {
    t_last_key = key;
    t_last = it->second;
    return *it->second;
  }
  std::lock_guard<std::mutex> lock(g_table_mu);
  const OpInfo* found = nullptr;
  auto range = g_table.equal_range(key);
  for (auto e = range.first; e != range.second && !found; ++e)
    if (names(*e->second, schema)) found = e->second.get();
  if (!found) found = g_table.emplace(key, compute(op))->second.get();
  cache.map[key] = found;
  t_last_key = key;
  t_last = found;
  return *found;
}

}  // namespace pyalloc::registry
