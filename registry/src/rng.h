// rng.h — the generator state a random op ran with, kept so that its replay draws the same.
#pragma once

#include <ATen/core/Generator.h>

namespace pyalloc::registry {

// Note [Generator snapshots]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~
// A random op (dropout's bernoulli_, randn_like) is recorded with a copy of its generator's
// state from before it ran; a replay runs it from that state and draws the same numbers.
// `Generator::clone()` makes the copy, and for a CUDA generator (Philox: a seed and an
// offset) that is cheap. A CPU generator is a Mersenne Twister: clone() constructs a new
// one, which seeds its 624-word state (about 4,800 instructions), and allocates 5 KiB,
// beyond malloc's small-size caches, only for the copy to overwrite the state. On the
// simulated device that was about 400 of the 3,700 instructions the registry added per op
// on the MLP of small layers (callgrind, 30 steps, 2026-11-28), a cost a GPU run never pays.
// A CPU snapshot is copied instead into a generator a dead recording gave back (a free list
// of at most kRecycledGenerators); only when the list is empty is a new one constructed.
// What is copied is what CPUGeneratorImpl::clone copies: the engine and the two cached
// normal samples. Generators of other devices (and CPU generators of another class) are
// cloned as before.
class RngSnapshot {
 public:
  // `generator`'s state now. The caller holds the generator's mutex.
  explicit RngSnapshot(const at::Generator& generator);
  ~RngSnapshot();  // gives a recycled CPU generator back to the free list
  RngSnapshot(RngSnapshot&&) noexcept = default;
  RngSnapshot& operator=(RngSnapshot&&) = delete;
  RngSnapshot(const RngSnapshot&) = delete;
  RngSnapshot& operator=(const RngSnapshot&) = delete;

  // A generator in the snapshot's state: read it (get_state), never draw from it.
  const at::Generator& generator() const { return copy_; }

 private:
  at::Generator copy_;
};

// How many CPU generators the free list keeps (each about 5 KiB): more than the random ops
// of a step in any model of the zoo, so a step in steady state constructs none.
constexpr std::size_t kRecycledGenerators = 256;

}  // namespace pyalloc::registry
