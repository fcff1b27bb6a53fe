// writes.cpp — writes to recorded storages: readers of earlier versions, settling readers, freezing.
#include "own_ops.h"
#include "registry.h"

#include <algorithm>
#include <cstdlib>

namespace pyalloc::registry {
// --- writes ----------------------------------------------------------------------------------

// Note [Readers of an earlier version]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A write that extends a node's chain leaves its earlier contents recomputable: they are
// the chain's first steps. So the ops recorded from them keep their lineage, with a Ref to
// the version they read, and replaying one rebuilds that version apart from the node — or
// takes it from the node itself when the node is midway through its own restore and holds
// that version (restoring `g` after `g.add_(c)`, where `c` was made from `g`, passes
// through exactly that). Nothing is frozen or rebuilt at the write. Backward does this in
// every residual block: autograd sums the two gradients of a skip connection in place,
// into the gradient that went down the skip, after the block's batch norm backward read
// it; freezing what was made from it, or rebuilding the dead batch norm gradient to hold
// it, made the CNN's unconstrained backward hold twice stock's memory (57 MiB where stock
// held 29) and replay 18 ops a step with nothing evicted.
// A chain frozen later (a write it cannot follow, the end of a backward pass) takes its
// early versions with it, so its readers of those are settled first, like any reader of
// overwritten contents (settle_readers_locked).
void Registry::invalidate_readers(Lock& lock, const c10::StorageImpl* key, bool keep) {
  c10::SmallVector<Handle, 4> readers;
  Node* node = by_key_locked(key);
  if (node) {
    if (node->readers.empty()) return;
    if (keep) {
      node->stale_readers = true;
      return;
    }
    readers.assign(node->readers.begin(), node->readers.end());
    node->readers.clear();
    node->stale_readers = false;
  } else {
    return invalidate_leaf_readers(lock, key, /*may_copy=*/true);
  }
  // See Note [A written node keeps its chain while its readers settle].
  Settling settling(*this, node->handle);
  settle_readers_locked(lock, readers, [&](c10::ArrayRef<Handle> rest) {
    // The write will not happen (the op fails): the readers not yet frozen still read the
    // current contents.
    if (Node* n = by_key_locked(key)) {
      n->readers.insert(n->readers.end(), rest.begin(), rest.end());
    } else {
      auto& leaf = leaf_readers_[key];
      leaf.insert(leaf.end(), rest.begin(), rest.end());
    }
  });
}

void Registry::invalidate_leaf_readers(Lock& lock, const c10::StorageImpl* key, bool may_copy) {
  auto it = leaf_readers_.find(key);
  if (it == leaf_readers_.end()) return;
  if (may_copy && copy_leaf_for_readers_locked(lock, key)) return;
  it = leaf_readers_.find(key);  // the copy's attempt may have let go of the lock
  if (it == leaf_readers_.end()) return;
  c10::SmallVector<Handle, 4> readers(it->second.begin(), it->second.end());
  leaf_readers_.erase(it);
  settle_readers_locked(lock, readers, [&](c10::ArrayRef<Handle> rest) {
    // The write will not happen (the op fails): the readers not yet frozen still read the
    // current contents.
    auto& leaf = leaf_readers_[key];
    leaf.insert(leaf.end(), rest.begin(), rest.end());
  });
}

// Note [A written leaf's readers keep a copy]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A storage that is no node (a parameter, an input, a buffer) is about to be written by an
// op, and ops recorded from its contents are still needed: settling them restores and
// freezes them, so they stay resident for as long as the program holds them. Where the
// program holds a whole graph across an optimizer step (PCGrad's per-task
// `autograd.grad(..., retain_graph=True)`, kept in its variables until the next forward
// replaces them; Transformer-XL's memory of the last segment) that is most of its
// activations: tools/user_programs/pcgrad ran out of memory under recompute at 0.4 of its
// peak with 28 MiB of its 46 MiB budget in eight frozen activations, and nothing evictable.
// So where the live readers weigh at least twice the storage, they keep a copy of it
// instead: the storage's bytes are copied into a storage of the registry's own on the same
// device (allocated quietly: where the budget cannot hold it, the readers settle as
// before), every recording of theirs that took a tensor on it takes the same view of the
// copy, and the copy becomes their leaf. Nothing is restored or frozen; the copy lives as
// long as one of those recordings does (the program drops the old graph, and the copy goes
// with it), and the write goes ahead on the program's storage.
// A copy costs the storage's bytes for that long, where freezing costs the readers' bytes
// resident for as long: hence twice, the rule of Note [What plain inputs derive] in
// dispatch.cpp. A dead reader counts the live nodes recorded from it directly (a batch
// norm's output, dead since the ReLU after it keeps its own result: settling it freezes the
// ReLU's), and no further: after a plain `loss.backward()` every layer's dead activation is
// lineage of the logits the program still holds, and counting the logits at each layer's
// write would copy every weight of the model to keep one tensor evictable. (The first
// layer's weight is written first: its settling freezes the logits, as plain PyTorch holds
// them, and later writes find no live reader.) And a reader counts its bytes less the plain
// tensors its own recording holds: frozen, it lets them go, and kept recomputable it keeps
// them. A distillation loss `mse_loss(proj(s_feat), t_feat)` kept by the program across the
// step holds the teacher's 2 MiB feature, which the next forward replaces: counted whole,
// it had the projection's weight copied, the old feature stayed through the next step, and
// tools/user_programs/distill_hooks' least budget went from 0.38 of its peak to 0.42.
// Only for a write by an op, which leaves the storage where it is: a rebind (`set_`,
// Module._apply) or a resize outside the dispatcher settles as before. So do a sparse
// tensor's parts, which a recording holds inside a sparse tensor of its own.
// (PYALLOC_NO_LEAF_COPIES=1 switches the copies off, for A/B measurements.)
std::size_t Registry::live_reader_bytes_locked(c10::ArrayRef<Handle> readers,
                                               const c10::StorageImpl* written) {
  std::size_t bytes = 0;
  c10::SmallVector<Handle, 8> counted;
  const auto live = [&](const Node* node) {
    return node && !node->frozen && node->lineage() && !node->dead && !node->weak.expired();
  };
  // What kept recomputable frees: the node's bytes, less the plain tensors its own
  // recordings hold (settled, they would go with them when the program drops them).
  const auto count = [&](const Node* node) {
    if (std::find(counted.begin(), counted.end(), node->handle) != counted.end()) return;
    counted.push_back(node->handle);
    c10::SmallVector<const c10::StorageImpl*, 4> plain;
    std::size_t held = 0;
    const auto hold = [&](const at::Tensor& t) {
      const c10::StorageImpl* key = t.defined() ? storage_of(t) : nullptr;
      if (!key || key == written || by_key_locked(key) || parameter_storage_locked(key) ||
          std::find(plain.begin(), plain.end(), key) != plain.end())
        return;
      plain.push_back(key);
      held += key->nbytes();
    };
    for (const Step& step : node->steps)
      for (const c10::IValue& v : step.rec->args) for_each_tensor(v, hold);
    if (node->nbytes > held) bytes += node->nbytes - held;
  };
  for (Handle h : readers) {
    const Node* reader = find_locked(h);
    if (!reader || reader->frozen || !reader->lineage()) continue;
    if (live(reader)) {
      count(reader);
      continue;
    }
    // Dead: settling it freezes what was made from it, one op on (a batch norm's output,
    // which the ReLU after it does not keep).
    for (Handle r : reader->readers)
      if (const Node* next = find_locked(r); live(next)) count(next);
  }
  return bytes;
}

namespace {
// `v` (a recorded argument) with every tensor on `from` replaced by the same view of `to`.
// A list is copied before an element is set: the recording's lists are shared with the
// stacks of replays.
c10::IValue repointed(const c10::IValue& v, const c10::StorageImpl* from,
                      const c10::intrusive_ptr<c10::StorageImpl>& to) {
  const auto on_from = [&](const c10::IValue& e) {
    return e.isTensor() && e.toTensor().defined() && storage_of(e.toTensor()) == from;
  };
  if (on_from(v)) return same_view_on(to, v.toTensor());
  if (v.isTensorList()) {
    c10::List<at::Tensor> list = v.toTensorList();
    if (std::none_of(list.begin(), list.end(), [&](const at::Tensor& t) { return on_from(t); }))
      return v;
    list = list.copy();
    for (std::size_t j = 0; j < list.size(); ++j)
      if (on_from(list.get(j))) list.set(j, same_view_on(to, list.get(j)));
    return list;
  }
  if (v.isList() && !v.isIntList() && !v.isDoubleList() && !v.isBoolList()) {
    c10::impl::GenericList list = v.toList();
    if (std::none_of(list.begin(), list.end(), on_from)) return v;
    list = list.copy();
    for (std::size_t j = 0; j < list.size(); ++j)
      if (on_from(list.get(j))) list.set(j, same_view_on(to, list.get(j).toTensor()));
    return list;
  }
  return v;
}

// Whether `v` holds a sparse tensor with a part on `key`.
bool sparse_part_on(const c10::IValue& v, const c10::StorageImpl* key) {
  bool found = false;
  for_each_tensor(v, [&](const at::Tensor& t) {
    if (t.defined())
      for_each_sparse_part(t, [&](const at::TensorBase& part) { found = found || storage_of(part) == key; });
  });
  return found;
}
}  // namespace

bool Registry::copy_leaf_for_readers_locked(Lock& lock, const c10::StorageImpl* key) {
  static const bool disabled = std::getenv("PYALLOC_NO_LEAF_COPIES") != nullptr;
  if (disabled) return false;
  auto it = leaf_readers_.find(key);
  if (it == leaf_readers_.end()) return false;
  auto* storage = const_cast<c10::StorageImpl*>(key);
  const std::size_t nbytes = storage->nbytes();
  if (nbytes == 0 || storage->device_type() != settings_.device_type || !data_of(storage) ||
      !storage->allocator())
    return false;
  {
    const c10::SmallVector<Handle, 8> readers(it->second.begin(), it->second.end());
    if (live_reader_bytes_locked(readers, key) < 2 * nbytes) return false;
    for (Handle h : readers)
      if (const Node* reader = find_locked(h))
        for (const Step& step : reader->steps)
          for (const c10::IValue& v : step.rec->args)
            if (sparse_part_on(v, key)) return false;
  }
  // The copy, with the lock let go (an allocation and an op: Note [Calling out] in
  // reclaim.cpp). The program's storage is held meanwhile; the write waits for this.
  const auto source = c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(storage);
  c10::intrusive_ptr<c10::StorageImpl> copy;
  {
    Unlocked unlocked(lock);
    try {
      c10::DataPtr data;
      {
        TentativeScope quiet;  // a copy the budget cannot hold: the readers settle instead
        data = source->allocator()->allocate(nbytes);
      }
      copy = c10::make_intrusive<c10::StorageImpl>(c10::StorageImpl::use_byte_size_t(), nbytes,
                                                   std::move(data), source->allocator(),
                                                   /*resizable=*/false);
      OwnOpGuard guard;
      copy_bytes(copy, source, nbytes);
    } catch (const c10::OutOfMemoryError&) {
      copy.reset();
    }
  }
  if (!copy) return false;
  it = leaf_readers_.find(key);
  if (it == leaf_readers_.end()) return true;  // every reader went meanwhile: nothing to keep
  std::vector<Handle> readers = std::move(it->second);
  leaf_readers_.erase(it);
  for (Handle h : readers) {
    Node* reader = find_locked(h);
    if (!reader) continue;
    for (const Step& step : reader->steps) {
      // The recording is shared by every node its op made, and read only under the lock.
      auto& args = const_cast<Recording&>(*step.rec).args;
      for (c10::IValue& v : args) v = repointed(v, key, copy);
    }
  }
  auto& now = leaf_readers_[copy.get()];
  now.insert(now.end(), readers.begin(), readers.end());
  ++counters_.leaf_copies;
  counters_.leaf_copy_bytes += static_cast<std::int64_t>(nbytes);
  return true;
}

// Note [A written node keeps its chain while its readers settle]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Settling a node's readers (a write its chain cannot follow, or freezing it) restores
// each evicted one from the node's earlier versions, rebuilt by replaying the node's chain:
// the chain must last until the last reader is settled. But settling a dead reader freezes
// the live nodes made from it instead (freeze_dependents_locked), and the node being
// written can be one of them: autograd sums a residual stream's gradients in place, into
// the buffer earlier layers' gradients were read from, so each layer's gradient reads the
// buffer and the buffer's next step reads that gradient — a cycle through readers of
// earlier versions. Frozen there, midway, the node dropped its chain, and the next evicted
// reader's restore failed with "its input was modified in place after it was recorded"
// (the zoo's MLP-Mixer under recompute at 0.2 of its peak, where the ninth write to a
// gradient buffer no longer extends its chain). So while a node's readers are settled it
// is `settling_`, and freeze_dependents_locked passes over it: its own freezing comes after
// the last reader (the write that cannot extend it, or freeze_now, freezes it next), and
// the dead reader it read stays as lineage while the chain that reads it lasts.
bool Registry::reads_earlier_locked(const Node* reader, const Node* node) const {
  for (const Step& step : reader->steps)
    for (const Ref& ref : step.rec->refs)
      if (ref.node == node->handle && ref.version < node->version) return true;
  return false;
}

void Registry::freeze_now(Lock& lock, Node* node) {
  if (node->frozen) return;
  if (node->stale_readers) {
    const Handle h = node->handle;
    c10::SmallVector<Handle, 4> stale;
    c10::SmallVector<Handle, 2> current;
    for (Handle r : node->readers) {
      const Node* reader = find_locked(r);
      if (reader && reads_earlier_locked(reader, node)) stale.push_back(r);
      else current.push_back(r);
    }
    node->readers.assign(current.begin(), current.end());
    node->stale_readers = false;
    Settling settling(*this, h);  // Note [A written node keeps its chain while its readers settle]
    settle_readers_locked(lock, stale, [&](c10::ArrayRef<Handle> rest) {
      if (Node* n = find_locked(h)) {
        n->readers.insert(n->readers.end(), rest.begin(), rest.end());
        n->stale_readers = true;
      }
    });
    node = find_locked(h);
    if (!node || node->frozen) return;
  }
  // Freezing drops the lineage, the only way back for an evicted node: one evicted
  // meanwhile (settling its readers restores them, and restores evict) comes back first.
  // Seen when DTR's victims (the thrash guard's fallback) took such a node: a GRU's
  // weights then read as "an evicted tensor has no lineage left".
  if (node->evicted) {
    const Handle h = node->handle;
    restore_now(lock, node);
    node = find_locked(h);
    if (!node || node->frozen) return;
  }
  freeze_locked(node);
}

// Note [Evicted dependents come back first]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Settling a dead reader whose live dependents are resident freezes them and lets the dead
// reader go; with one of them evicted, the dead reader is rebuilt and kept (Note [Writes
// under dead readers]). Each dead reader is settled on its own, so a dependent made from
// many of them keeps them all: a neural ODE whose trajectory (`z`, 1.7 MiB, evicted) the
// program reads after the optimizer's step had the outputs of its 48 evaluations of the
// dynamics rebuilt and held at the step's first write to the dynamics' weights, 32 MiB, and
// the step ran out of memory at 0.4 of the peak, where plain PyTorch holds 3 MiB there.
// So before the readers of a write are settled, the evicted live nodes made from its dead
// readers are counted: when they are no larger than the dead readers that would be kept
// for them, they are brought back first (their replay rebuilds the dead readers for as
// long as it runs) and frozen, and every dead reader then goes. What comes back is what
// the program holds, which it would hold in memory without a registry too; what was kept
// instead was not. When the dead readers are smaller (a model's last hidden state, kept
// for its evicted logits), they are kept as before.
void Registry::restore_evicted_dependents_locked(Lock& lock, c10::ArrayRef<Handle> readers) {
  c10::SmallVector<Handle, 4> evicted;
  std::size_t evicted_bytes = 0, dead_bytes = 0;
  for (Handle h : readers) {
    Node* dead = find_locked(h);
    if (!dead || dead->frozen || dead->pins || !(dead->dead || dead->weak.expired())) continue;
    bool feeds = false;
    for (Handle e : dependents_locked(dead).evicted) {
      const Node* node = find_locked(e);
      if (!node || node->pins) continue;  // being restored already
      feeds = true;
      if (std::find(evicted.begin(), evicted.end(), e) == evicted.end()) {
        evicted.push_back(e);
        evicted_bytes += node->nbytes;
      }
    }
    if (feeds) dead_bytes += dead->nbytes;
  }
  if (evicted.empty() || evicted_bytes > dead_bytes) return;
  for (Handle h : evicted) {
    Node* node = find_locked(h);
    if (!node || node->frozen || !node->evicted) continue;
    restore_now(lock, node);
    if ((node = find_locked(h))) freeze_now(lock, node);
  }
}

template <typename PutBack>
void Registry::settle_readers_locked(Lock& lock, c10::ArrayRef<Handle> readers, PutBack&& put_back) {
  try {
    restore_evicted_dependents_locked(lock, readers);  // See Note [Evicted dependents come back first]
  } catch (...) {
    put_back(readers);
    throw;
  }
  bool swept = false;
  for (std::size_t i = 0; i < readers.size(); ++i) {
    Node* reader = find_locked(readers[i]);
    if (!reader || reader->frozen) continue;
    if (!reader->dead && reader->weak.expired()) mark_dead_locked(reader);
    if (reader->pins == 0 && !program_holds_locked(reader)) {
      // Only lineage holds it. Whether lineage still needs it is transitive (its readers
      // may be dead too: last step's activations at the optimizer's step), and a sweep
      // forgets whole dead chains: without one, every write to a parameter would rebuild
      // the activations recorded from it, only to freeze them.
      if (!swept) {
        sweep_locked(/*tidy=*/false);
        swept = true;
        reader = find_locked(readers[i]);
        if (!reader || reader->frozen) continue;
      }
      if (!has_readers_locked(reader)) {
        forget_locked(reader);  // nothing uses it: no need to keep it recomputable
        continue;
      }
      if (reader->dead && freeze_dependents_locked(lock, reader)) continue;
    }
    try {
      if (reader->evicted) {
        restore_now(lock, reader);  // while its inputs still hold what it was made from
        reader = find_locked(readers[i]);
        if (!reader) continue;
      }
      freeze_now(lock, reader);
    } catch (...) {
      put_back(readers.slice(i));
      throw;
    }
  }
}

// Note [Writes under dead readers]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A storage about to be overwritten was read by an op whose result is dead (the program
// let it go) but still needed as lineage: live nodes were made from it, directly or
// through more dead ones. Once the write lands, nothing could rebuild it. Rebuilding it
// now, to hold it, costs a replay and its bytes for as long as those live nodes last; the
// live nodes themselves are on the device already (when none was evicted), and freezing
// them costs neither. When a live dependent is evicted, bringing it back would rebuild
// the dead reader anyway: then the dead reader is rebuilt and kept, as any reader is.
Registry::Dependents Registry::dependents_locked(const Node* dead) {
  Dependents found;
  walk_readers_locked(dead, [&](Node* reader) {
    // The node whose readers are being settled is frozen once they all are, not before.
    if (reader->handle == settling_) return Walk::kOver;
    // Dead or dying, without marking it here: mark_dead_locked walks readers itself.
    if (reader->dead || reader->weak.expired()) {
      if (reader->pins) {  // being replayed: leave it to the rebuild
        found.replaying = true;
        return Walk::kOver;
      }
      found.dead.push_back(reader->handle);
      return Walk::kInto;
    }
    (reader->evicted ? found.evicted : found.live).push_back(reader->handle);
    return Walk::kOver;
  });
  return found;
}

bool Registry::freeze_dependents_locked(Lock& lock, Node* dead) {
  Dependents found = dependents_locked(dead);
  if (found.replaying || !found.evicted.empty()) return false;
  for (Handle h : found.live)
    if (Node* node = find_locked(h)) freeze_now(lock, node);
  found.dead.insert(found.dead.begin(), dead->handle);
  release_dead_locked(found.dead);  // no lineage reads them now
  return true;
}

// Note [Inputs a frozen node no longer reads]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A frozen input is held by the registry (`held`) while recorded ops read it (Note [Who
// holds a storage] in node.h). Two ways that hold outlived its readers, and each step of a
// reversible network (a custom Function that resizes its inputs' storages in backward, as
// revlib-style code does, freezing the previous block's outputs) left 4 MiB allocated that
// nothing held, until the backstop sweep thousands of ops later — and `numpy()` of an
// activation something had read left it for good:
// * a reader that is frozen in turn keeps no Refs, so nothing looked at its inputs again
//   (a forgotten reader's are, by release_dead_locked). Freezing a node now queues its
//   inputs (unread_), and the next entry point looks at them;
// * a storage the program had taken `untyped_storage()` of: while `held` keeps the
//   StorageImpl referenced, PyTorch keeps its Python object too, so the program seemed to
//   hold it (program_holds_locked) and the registry kept `held` for it.
// So wherever an input is looked at again, a live one that nothing reads lets go of `held`
// (let_go_if_unread_locked): it dies when the program drops it, as with no registry. One
// nothing reads and the program does not hold is forgotten, with what only it read.
void Registry::let_go_if_unread_locked(Node* node) {
  if (!node->held || node->dead || has_readers_locked(node)) return;
  graveyard_storages_.push_back(std::move(node->held));  // Note [Releasing outside the lock]
  buried_.store(true, std::memory_order_relaxed);
}

void Registry::revisit_unread_locked() {
  if (unread_.empty()) return;
  c10::SmallVector<Handle, 16> work;
  work.swap(unread_);
  release_dead_locked(work);  // looks at each (see above)
}

void Registry::freeze_locked(Node* node) {
  if (node->frozen) return;
  if (!node->dead && node->weak.expired()) mark_dead_locked(node);
  unmark_locked(node);
  node->frozen = true;
  node->append_inputs(unread_);  // See Note [Inputs a frozen node no longer reads]
  const c10::intrusive_ptr<c10::StorageImpl> held = node->held;
  bury_locked(node);  // its lineage goes, releasing its inputs
  node->held = held;
  ++counters_.frozen;
  // Read by recorded ops: nothing could bring it back, so the registry keeps it.
  if (has_readers_locked(node) && !node->held) node->held = node->storage();
  mark_locked(node);  // it can still be swapped
}

}  // namespace pyalloc::registry
