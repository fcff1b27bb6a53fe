// op_info.h — what the registry needs to know about an operator, worked out once.
//
// The per-op path asks these questions of every op; the answers depend only on the
// operator, so they are computed on its first call and cached (per thread, over one
// shared table).
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>

#include <cstdint>
#include <string>
#include <vector>

namespace pyalloc::registry {

// How the "model" cost counts an op's arithmetic (see Registry::cost_of).
enum class Flops : std::uint8_t { kNone, kMatmul, kMatmulWithBias, kConvolution };

struct OpInfo {
  std::string base;      // "aten::mul" (checked on every cache hit: see op_info())
  std::string overload;  // "Tensor"
  // A CompositeImplicitAutograd op with no autograd kernel of its own: it runs as calls to
  // other ops. See Note [Composite ops].
  bool composite = false;
  // aten::set_data (`x.data = y`), and the check that comes first in it: the tensor gets
  // another storage, with no op that writes the one it had. See Note [Rebinding a
  // tensor's data] in dispatch.cpp.
  bool rebinds = false;
  // Kernels on the autocast keys: under autocast, the op is re-dispatched after its
  // inputs are cast, and the casts are ops of their own. See Note [Composite ops].
  bool autocast_cpu = false;
  bool autocast_cuda = false;
  // Every result aliases an argument (views, in-place and out= ops): the op never makes a
  // new storage, so nothing it returns is recorded.
  bool aliases_only = false;
  bool random = false;            // tag nondeterministic_seeded: replayed under saved RNG state
  bool nondeterministic = false;  // tag nondeterministic_bitwise: replay may differ
  // Fills a new tensor whose contents do not depend on any tensor's values (zeros, ones,
  // full, arange, the random factories, their _like and new_ forms; not empty, whose
  // contents are whatever was there). See Note [Fills a write makes activations].
  bool fill = false;
  // Positions of the arguments the op writes: those its schema marks (a!), and the
  // running statistics batch norms update behind a schema that does not say so.
  std::vector<std::uint16_t> written;
  // Of those, the ones whose contents before the op its results may depend on: a recording
  // keeps a copy of them as they were (Note [What a recorded op writes] in dispatch.cpp).
  // All but the batch norms' running statistics, which training-mode batch norm writes
  // without reading and inference-mode batch norm reads without writing, and what random
  // ops write, their draws (rrelu_with_noise's noise, as large as its input).
  std::vector<std::uint16_t> snapshot;
  // Batch norms' running statistics (their positions), which training mode writes without
  // its results depending on them: a recording made in training mode is not their reader
  // (Note [Running statistics are read only in inference]). `training_arg`: the position of
  // the op's `training` flag, or -1 where the op always trains (_batch_norm_with_update).
  std::vector<std::uint16_t> running_stats;
  std::int16_t training_arg = -1;
  Flops flops = Flops::kNone;
  std::uint16_t num_arguments = 0;
  std::uint16_t num_returns = 0;
};

// The info of `op` (a reference that stays valid for the life of the process).
const OpInfo& op_info(const c10::OperatorHandle& op);

// Makes op_info() forget what it cached when an operator is deregistered. Call once before
// op_info() is first used (register_fallback() does).
void watch_deregistrations();

}  // namespace pyalloc::registry
