// rng.cpp — generator snapshots: See Note [Generator snapshots] in rng.h.
#include "rng.h"

#include <ATen/CPUGeneratorImpl.h>

#include <mutex>
#include <vector>

namespace pyalloc::registry {
namespace {

std::mutex g_free_mu;
// Never destroyed: recordings may die during exit, after static destructors ran.
std::vector<at::Generator>* const g_free = new std::vector<at::Generator>();

at::CPUGeneratorImpl* as_cpu(const at::Generator& generator) {
  if (!generator.defined() || generator.device().type() != c10::DeviceType::CPU) return nullptr;
  return dynamic_cast<at::CPUGeneratorImpl*>(generator.unsafeGetGeneratorImpl());
}

at::Generator take_free() {
  std::lock_guard<std::mutex> lock(g_free_mu);
  if (g_free->empty()) return at::make_generator<at::CPUGeneratorImpl>();
  at::Generator out = std::move(g_free->back());
  g_free->pop_back();
  return out;
}

}  // namespace

RngSnapshot::RngSnapshot(const at::Generator& generator) {
  const at::CPUGeneratorImpl* source = as_cpu(generator);
  if (!source) {
    copy_ = generator.clone();
    return;
  }
  at::Generator copy = take_free();
  auto* target = copy.get<at::CPUGeneratorImpl>();
  // CPUGeneratorImpl's accessors are not const; they only read.
  auto* from = const_cast<at::CPUGeneratorImpl*>(source);
  target->set_engine(from->engine());
  target->set_next_float_normal_sample(from->next_float_normal_sample());
  target->set_next_double_normal_sample(from->next_double_normal_sample());
  copy_ = std::move(copy);
}

RngSnapshot::~RngSnapshot() {
  // A snapshot nobody else holds (a replay's GeneratorState holds it only while it runs).
  if (!as_cpu(copy_) || !copy_.getIntrusivePtr().unique()) return;
  std::lock_guard<std::mutex> lock(g_free_mu);
  if (g_free->size() < kRecycledGenerators) g_free->push_back(std::move(copy_));
}

}  // namespace pyalloc::registry
