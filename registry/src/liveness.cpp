// liveness.cpp — when nodes die: deaths noted by the engine, burial, forgetting, the backstop sweep.
#include "own_ops.h"
#include "registry.h"

#include <algorithm>

namespace pyalloc::registry {
namespace {

// Deaths noted by the engine are taken this many at a time on the per-op path.
constexpr std::uint64_t kDeathsPerDrain = 16;
// At most this many nodes are watched (Note [Deaths worth a drain]); more wait for a batch.
constexpr std::size_t kMaxWatched = 16;

}  // namespace

// --- liveness --------------------------------------------------------------------------------

void Registry::mark_dead_locked(Node* node) {
  if (node->dead) return;
  set_dead_locked(node);
  charge_readers_locked(node);
}

void Registry::set_dead_locked(Node* node) {
  if (!node->evicted && has_readers_locked(node)) ++counters_.eager_evictions;
  node->dead = true;
  node->evicted = true;
  node->marked = false;  // the engine's mark went with the block
  node->arriving = node->prefetched = false;
  if (node->key) {
    auto it = by_key_.find(node->key);
    if (it != by_key_.end() && it->second == node) by_key_.erase(it);
    node->key = nullptr;
  }
  // The host copy, if clean, still holds the contents: a reader's replay may use it.
}

// Note [Dead inputs cost their readers]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Replaying a node rebuilds its dead inputs first (their contents exist nowhere else), and
// theirs, back to inputs that are still there. So what evicting a node costs is its own op
// plus every dead node its replay passes through, and a death reprices every live node
// downstream of it along dead readers: the dead node's readers, and, where a reader is
// itself dead, that reader's readers, and so on. Backward makes this the rule: each
// forward activation dies once its gradient is made, after the activations made from it
// (autograd runs in reverse), so the gradient with respect to an early layer's output is
// rebuilt only by replaying the forward from the last live activation and the backward
// from the loss down to it. Priced at its own op alone, or with its inputs' deaths only, it
// looks as cheap as an activation and the engine takes it first — then every use replays
// the chain, and the replays evict each other (the MLP at 0.35 of its peak did not finish a
// step, the transformer took 30 s). So a death adds the dead node's cost to each live node
// reached through dead readers, once per death (deaths are final), and the engine is told
// the new price. A gradient made in backward is priced with the gradients it read when it
// is made (they die at once, and deaths are noticed in batches, after the engine may have
// chosen), so its own death charges nobody again; the deaths of its ancestors still pass
// through it. Diamonds between live nodes count a dead node once per live node, which is
// the truth; a live node charged by two paths of one inherited gradient is an overestimate,
// which errs towards evicting something else. Evicted inputs that are not dead are not
// charged (they come back and go again; DTR's evicted-neighbourhood sum would need updates
// both ways).
//
// Note [Charging a batch of deaths]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Deaths come in batches (Note [Noticing deaths]), newest first, and a chain of
// activations that died together is the common case (a step's elementwise ops): each
// death walks down through the dead readers to the live nodes below, n(n+1)/2 steps for a
// chain of n. So each death keeps the live nodes it charged (its frontier, a range of
// frontiers_), and a later death that reaches a dead node with a frontier walks that
// instead of the dead nodes below it: the same live nodes, each charged once per death as
// before, in one step each. A frontier node that died since is walked into like any dead
// reader. A frontier stays true after its batch: a dead node gains no readers (only a
// program's op records one, and the program no longer holds it), and the live nodes it
// reached can only die (then they are walked into, as above) or be forgotten (a handle
// that finds nothing is passed over), so the live nodes reachable through it now are
// those its frontier leads to. Frontiers are kept until frontiers_ holds kMaxFrontiers
// handles; then, at the next batch or sweep (never inside a walk, which holds ranges of
// frontiers_), an epoch ends and they start afresh. Kept per batch only, a recurrent
// network's backward walked its whole dead tail on every death: the zoo's GRU (hundreds of
// per-timestep nodes, dying a cell at a time) visited about 300 nodes a death, 435,000 a
// step, and its step with a policy on and no pressure took 1.15x the step without; now
// about 31 a death and 1.09x. The walk reaches the same live nodes and charges them the
// same; only the order it reaches them in, and so the order of their marks, can differ.
namespace {
constexpr std::size_t kMaxFrontiers = std::size_t{1} << 16;
}  // namespace

void Registry::charge_readers_locked(Node* dead) {
  // Readers the walk finds dead but not yet noticed (Note [Deaths found by a charge]) are
  // charged as live by it and walked from here, each after the walk that found it.
  c10::SmallVector<Handle, 8> found_dead;
  charge_walk_locked(dead, found_dead);
  while (!found_dead.empty()) {
    Node* node = find_locked(found_dead.pop_back_val());
    if (!node || node->dead) continue;
    set_dead_locked(node);
    charge_walk_locked(node, found_dead);
  }
}

// Note [Deaths found by a charge]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A live reader a charge reaches is re-marked, so that the engine has its new price. If
// its storage has died since the last drain, it has no memory to mark: it is dead, but
// the engine's note of that waits in the queue. Marking it dead there, as mark_locked does
// when it finds no data, walked its readers inside the charge's walk, which shares the
// walk's stamp and work list: the inner walk emptied the outer one's list, and the outer
// charge stopped short of the live nodes still on it. That happened on every step of
// every model (15-46 times a step on the CNN, the transformer, the ViT and BERT, over seven
// steps, five of them under recompute at 0.4; about 500 on the GRU, whose backward frees a
// cell at a time). So such a
// reader is charged like a live one (its price is its readers' price once it is walked)
// and marked dead after the walk, whose own charge then passes on through it.
void Registry::charge_walk_locked(Node* dead, c10::SmallVectorImpl<Handle>& found_dead) {
  if (!dead->lineage() || dead->backward || dead->readers.empty()) return;
  const auto begin = static_cast<std::uint32_t>(frontiers_.size());
  walk_readers_locked(dead, [&](Node* reader) {
    if (reader->dead)  // rebuilt only after `dead`: its readers pay
      return reader->frontier_epoch == frontier_epoch_ ? Walk::kFrontier : Walk::kInto;
    reader->cost += dead->cost;
    // What its replay must rebuild: Note [A restore needs its dead lineage's memory].
    reader->dead_bytes += static_cast<double>(dead->nbytes) + dead->dead_bytes;
    // set_evictable updates the engine's cost. Another thread may drop the storage's last
    // reference between the two checks: a failed mark that finds it expired is a death too.
    if (reader->marked &&
        (reader->weak.expired() || (!try_mark_locked(reader) && reader->weak.expired())))
      found_dead.push_back(reader->handle);
    frontiers_.push_back(reader->handle);
    return Walk::kOver;
  });
  dead->frontier_epoch = frontier_epoch_;
  dead->frontier_begin = begin;
  dead->frontier_end = static_cast<std::uint32_t>(frontiers_.size());
}

void Registry::new_frontier_epoch_if_full_locked() {
  // Only where no walk is under way (a batch's start, a sweep's): a walk holds ranges of
  // frontiers_ on its stack.
  if (frontiers_.size() < kMaxFrontiers) return;
  ++frontier_epoch_;  // every kept frontier lapses
  frontiers_.clear();
}

void Registry::adopt_locked(Node* node, c10::intrusive_ptr<c10::StorageImpl> storage) {
  // Dead first: the program's storage is gone, and its address, which by_key still maps
  // to this node if the death went unnoticed, may already belong to a new storage.
  mark_dead_locked(node);
  node->held = std::move(storage);
  node->weak = c10::weak_intrusive_ptr<c10::StorageImpl>(node->held);
}

void Registry::bury_locked(Node* node) {
  for (Step& step : node->steps) graveyard_.push_back(std::move(step.rec));
  node->steps.clear();
  if (node->held) graveyard_storages_.push_back(std::move(node->held));
  buried_.store(true, std::memory_order_relaxed);
}

Registry::Burial::~Burial() {
  if (!registry_.buried_.load(std::memory_order_relaxed)) return;
  // The thread's own lists, swapped with the registry's: each side keeps the other's
  // capacity, so a burial on every op (the chain of dead activations a step leaves)
  // allocates nothing. A nested Burial on this thread (a recording's release running an
  // entry point) finds the lists in use and takes fresh ones.
  thread_local std::vector<std::shared_ptr<const Recording>> t_recordings;
  thread_local std::vector<c10::intrusive_ptr<c10::StorageImpl>> t_storages;
  thread_local bool t_busy = false;
  std::vector<std::shared_ptr<const Recording>> fresh_recordings;
  std::vector<c10::intrusive_ptr<c10::StorageImpl>> fresh_storages;
  const bool own = !t_busy;
  auto& recordings = own ? t_recordings : fresh_recordings;
  auto& storages = own ? t_storages : fresh_storages;
  if (!lock_.owns_lock()) lock_.lock();
  recordings.swap(registry_.graveyard_);
  storages.swap(registry_.graveyard_storages_);
  registry_.buried_.store(false, std::memory_order_relaxed);
  lock_.unlock();
  // Released here, with no lock held.
  if (own) t_busy = true;
  recordings.clear();
  storages.clear();
  if (own) t_busy = false;
}

void Registry::forget_locked(Node* node) {
  if (node->marked && program_holds_locked(node)) unmark_locked(node);
  drop_copy_locked(node);
  if (node->ordinal >= 0) {
    auto it = by_ordinal_.find(node->ordinal);
    if (it != by_ordinal_.end() && it->second == node->handle) by_ordinal_.erase(it);
  }
  if (node->key) {
    auto it = by_key_.find(node->key);
    if (it != by_key_.end() && it->second == node) by_key_.erase(it);
  }
  bury_locked(node);  // its lineage and own storage go once the lock is dropped
  nodes_.destroy(node);
}

// Note [Noticing deaths]
// ~~~~~~~~~~~~~~~~~~~~~~
// A node's storage dies when the program and autograd drop their last tensor on it (Note
// [Who holds a storage] in node.h); the registry is not told. But the storage's memory goes
// back to the engine, and a block still marked evictable when its owner frees it is noted
// there (Engine::take_freed_marked): its handle is a death, or a block the registry freed
// itself, which the node's state tells apart. Each op reads a counter and, when it moved,
// takes the handles and forgets the dead nodes no recorded op reads, then whatever only
// they read, at once. That keeps lineage from holding what it no longer needs (the small
// tensors recorded ops took as arguments) and spares walking every node to find the dead.
// The handles are taken kDeathsPerDrain at a time (each take is a call under the engine's
// lock), and all of them before anything is evicted.
// Deaths the engine cannot see — a storage dropped while evicted, or while unmarked — wait
// for the backstop sweep.
// Note [Deaths worth a drain]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A dead node's recording keeps the tensors it took as they are (no node: an input batch, a
// tensor made under no_grad) until the node is forgotten, and that waits for a batch of
// kDeathsPerDrain deaths. Where the program drops such a tensor and the node that read it in
// the same iteration — a no_grad solver loop that mixes an activation into each iterate, as
// deep equilibrium models do (tools/user_programs/deq_fixed_point.py) — a loop making two
// nodes an iteration kept eight iterations of them: +12 MiB over plain PyTorch's 62 MiB peak.
// So a node whose recording keeps min_bytes or more of such tensors (parameters and views
// of them aside) is watched, and when one of them dies the deaths are drained at once. Few
// are watched at a time (kMaxWatched), and a check costs one weak pointer each when a
// death is pending.
// Only nodes made outside backward with grad mode off are watched, and the watch is
// cleared when a backward pass begins. With grad mode on, autograd's graph usually saves
// the same tensors (a convolution saves its input for its weight's gradient) and the
// program holds the batch through the step, so an early drain frees nothing; and in
// backward deaths come many an op and fill a batch soon. An early drain there only moved
// when dead nodes' recordings went, which reshapes a tight pool: watching every node
// (f57465d) drained when the zoo's DenseNet's stem convolution (it reads the batch) died at
// its block's end, and DenseNet's least budget under recompute in tests/programs/train.py
// went from 0.39 of its peak to 0.43 (MobileNet at 0.4 tipped the same way before the
// engine's Note [Long-lived requests do not borrow]); a packed attention projection's
// slices, views of a parameter, were counted as droppable.
void Registry::watch_death_locked(const Node* node) {
  if (watched_.size() < kMaxWatched) watched_.push_back(node->handle);
}

bool Registry::watched_died_locked() {
  bool died = false;
  auto kept = watched_.begin();
  for (Handle h : watched_) {
    const Node* node = find_locked(h);
    if (!node || node->dead) continue;  // gone, or its death already taken
    if (node->weak.expired()) {
      died = true;
      continue;
    }
    *kept++ = h;
  }
  watched_.erase(kept, watched_.end());
  return died;
}

void Registry::notice_deaths_locked(bool all) {
  const engine_api::Api& api = engine_api::api();
  const std::uint64_t count = api.freed_marked_count(engine_);
  if (count == deaths_seen_) return;
  if (!all && count - deaths_seen_ < kDeathsPerDrain && (watched_.empty() || !watched_died_locked()))
    return;
  deaths_seen_ = count;
  c10::SmallVector<Handle, 16> work;
  std::uint64_t buf[64];
  int overflowed = 0;
  for (std::size_t n; (n = api.take_freed_marked(engine_, buf, 64, &overflowed)) > 0;)
    work.append(buf, buf + n);
  if (overflowed) {
    sweep_locked(/*tidy=*/false);
    return;
  }
  release_dead_locked(work);
}

void Registry::release_dead_locked(c10::SmallVectorImpl<Handle>& work) {
  // A batch for Note [Charging a batch of deaths] (release_dead_locked never nests).
  new_frontier_epoch_if_full_locked();
  while (!work.empty()) {
    Node* node = find_locked(work.back());
    work.pop_back();
    if (!node || node->pins) continue;
    if (!node->dead && node->weak.expired()) mark_dead_locked(node);
    let_go_if_unread_locked(node);  // Note [Inputs a frozen node no longer reads]
    if (program_holds_locked(node)) continue;
    if (has_readers_locked(node)) {
      if (node->stale_readers && node->dead) forget_dead_cycle_locked(node, work);
      continue;
    }
    node->append_inputs(work);  // its inputs lose a reader: look at them again
    forget_locked(node);
  }
}

// Readers of an earlier version close cycles of readers: `g.add_(c)` after `b` read `g`
// and `c` was made from `b` gives g -> b -> c -> g. Once all of a cycle is dead, each of
// its nodes still has a reader and none is ever forgotten, so a dead node with such
// readers has what it feeds walked: if nothing there is live, pinned or held by the
// program, all of it goes.
bool Registry::forget_dead_cycle_locked(Node* node, c10::SmallVectorImpl<Handle>& work) {
  c10::SmallVector<Node*, 16> members{node};
  const bool all_dead = walk_readers_locked(node, [&](Node* reader) {
    // Dead or dying, without marking it here: mark_dead_locked walks readers itself.
    const bool dead = reader->dead || reader->weak.expired();
    if (!dead || reader->pins || program_holds_locked(reader)) return Walk::kStop;
    members.push_back(reader);
    return Walk::kInto;
  });
  if (!all_dead) return false;
  for (Node* member : members) member->append_inputs(work);
  for (Node* member : members) forget_locked(member);
  return true;
}

void Registry::collect() {
  Lock lock(mu_);
  Burial burial(*this, lock);
  if (!active_.load()) return;
  end_stale_backwards_locked(lock);
  notice_deaths_locked(/*all=*/true);
  revisit_unread_locked();
  sweep_locked(/*tidy=*/true);
}

void Registry::drop_fills_locked(bool all) {
  for (auto it = fills_.begin(); it != fills_.end();)
    it = all || it->second.weak.expired() ? bury_fill_locked(it) : std::next(it);
}

void Registry::sweep_locked(bool tidy) {
  new_frontier_epoch_if_full_locked();
  drop_fills_locked(/*all=*/false);
  std::vector<Node*> order;
  order.reserve(nodes_.size());
  for (Node* node = nodes_.oldest(); node; node = node->newer) order.push_back(node);
  // Newest first: readers before their inputs, so a whole chain goes in one pass.
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    Node* node = *it;
    if (node->pins) continue;
    if (!node->dead && node->weak.expired()) mark_dead_locked(node);
    if (program_holds_locked(node)) continue;
    if (!has_readers_locked(node)) {
      forget_locked(node);
    } else if (!node->evicted && evict_locked(node, /*eager=*/true)) {
      ++counters_.eager_evictions;  // a storage only lineage needed (the registry's own)
    }
  }
  // Dead cycles through readers of earlier versions (see forget_dead_cycle_locked).
  c10::SmallVector<Handle, 16> cyclic, work;
  for (Node* node = nodes_.oldest(); node; node = node->newer)
    if (node->stale_readers && node->dead && !node->pins) cyclic.push_back(node->handle);
  for (Handle h : cyclic) {
    Node* node = find_locked(h);
    if (node && !program_holds_locked(node)) forget_dead_cycle_locked(node, work);
  }
  release_dead_locked(work);
  if (!tidy) return;
  for (auto it = parameter_storages_.begin(); it != parameter_storages_.end();)
    it = it->second.expired() ? parameter_storages_.erase(it) : std::next(it);
  for (auto it = leaf_readers_.begin(); it != leaf_readers_.end();) {
    auto& readers = it->second;
    readers.erase(std::remove_if(readers.begin(), readers.end(),
                                 [&](Handle h) {
                                   Node* r = find_locked(h);
                                   return !r || !r->lineage();
                                 }),
                  readers.end());
    it = readers.empty() ? leaf_readers_.erase(it) : std::next(it);
  }
  for (Node* node = nodes_.oldest(); node; node = node->newer) {
    auto& readers = node->readers;
    readers.erase(std::remove_if(readers.begin(), readers.end(),
                                 [&](Handle r) { return nodes_.find(r) == nullptr; }),
                  readers.end());
  }
  next_sweep_ = counters_.ops + std::max<std::int64_t>(kSweepEvery, 8 * static_cast<std::int64_t>(nodes_.size()));
}

}  // namespace pyalloc::registry
