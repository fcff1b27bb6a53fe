// registry.h — the tensor registry: lineage of activations, eviction, recompute and swap.
//
// What it does (docs/design.md, "Rematerialization" and "Swap"):
//
//  * The per-op path (dispatch.cpp) sees every aten op of the threads that have the
//    policy on, forward and backward. Before an op runs, the registered storages it reads
//    are restored if evicted and pinned; storages it is about to write have whatever was
//    recorded from their old contents restored and frozen. After it runs, a new storage
//    made from a tensor that requires grad, with grad mode on, becomes a Node with the op
//    as its lineage, offered to the engine as evictable; an in-place op on a node extends
//    its chain.
//  * The engine chooses victims and calls evict() outside its lock: a node is freed in
//    place (its storage's data goes back to the engine; every tensor and view of it stays
//    valid), after a copy to the host pool when the policy swaps it.
//  * A restore replays the chain (recursively restoring inputs first) or copies the bytes
//    back from the host, and moves the result into the same storage: no autograd-visible
//    op, so version counters are untouched.
//
// One process-wide Registry object exists (registry()); start() and stop() give it an
// engine and settings for a while. It never dies, so an op in flight on another thread
// can never find it freed.
//
// Concurrency. One plain mutex, mu_, guards everything below it. Lock order: the registry's
// mutex, then the engine's (the registry calls the engine with mu_ held; the engine calls
// the registry only with its own lock dropped). Nothing that can allocate device memory
// runs with mu_ held — running an op, replaying one, allocating for a swap-in — because an
// allocation may call back into evict() on the same thread, and an op may reach a Python
// mode that calls ops of its own: such work runs under an Unlocked guard, and whatever was
// looked up before it is looked up again after (pins keep the nodes it needs). No Python,
// so no GIL, anywhere on this path.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include <c10/util/ArrayRef.h>
#include <c10/util/Exception.h>
#include <c10/util/SmallVector.h>
#include <c10/util/flat_hash_map.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "engine_api.h"
#include "node.h"
#include "node_table.h"
#include "op_info.h"
#include "node_pool.h"

namespace pyalloc::registry {

// Note [The per-op path's footprint]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// run_op runs on every aten op, between kernels that evict its code from the instruction
// cache: cachegrind on the MLP of small layers (twenty-fourth session) counted 302 L1
// instruction-cache misses an op the registry added for 2,394 instructions, 36 of them in
// run_op alone (11.5 KiB of code, its hot path spread among branches a training step never
// takes). So what a step rarely needs is kept out of its line: rare cases in functions of
// their own marked PYALLOC_COLD (GCC puts them, and the branch that calls them, in
// .text.unlikely), rare conditions marked C10_UNLIKELY (their blocks go to the function's
// end), and the library is linked so that its calls into itself are direct (Note [Calls
// inside the library] in pyalloc/_torch_shim.py). What is rare here: sparse arguments,
// subclasses and tangents, a thread's first op, hybrid's timing, the floor probe, copies of
// arguments an op writes, the time cost model.
#define PYALLOC_COLD __attribute__((cold, noinline))


enum class Policy : std::uint8_t { kRecompute, kSwap, kHybrid };
enum class CostModel : std::uint8_t { kModel, kTime, kBytes };

struct Settings {
  Policy policy = Policy::kRecompute;
  CostModel cost = CostModel::kModel;
  std::size_t min_bytes = 1 << 10;  // smaller storages are never nodes (option min_evictable)
  int prefetch = 4;                  // swap/hybrid: swap-ins started ahead per backward use
  bool relocate = false;  // recompute: frozen storages may leave through the host pool
  // The engine runs with option evictable_placement (read once: options never change).
  bool place_evictables = false;
  c10::DeviceType device_type = c10::DeviceType::CPU;  // the managed device
  int device_index = 0;
};

// What Python's Registry.stats() reports (docs/stats.md, "remat.*").
struct Counters {
  std::int64_t ops = 0;              // ops seen by the per-op path
  std::int64_t evictions = 0;        // nodes evicted at the engine's request
  std::int64_t eager_evictions = 0;  // nodes evicted because only lineage needed them
  std::int64_t recomputes = 0;
  std::int64_t recompute_ns = 0;
  std::int64_t frozen = 0;
  std::int64_t leaf_copies = 0;       // written leaves whose readers kept a copy instead of freezing
  std::int64_t leaf_copy_bytes = 0;
  std::int64_t relocations = 0;      // storages moved device to device (compaction)
  std::int64_t swap_outs = 0;
  std::int64_t swap_out_bytes = 0;
  std::int64_t swap_ins = 0;
  std::int64_t swap_in_bytes = 0;
  std::int64_t swap_wait_ns = 0;
  std::int64_t swap_fallbacks = 0;   // host pool full: dropped for recompute instead
  std::int64_t swap_failures = 0;    // copies the device refused to start
  std::int64_t prefetches = 0;
  std::int64_t prefetch_hits = 0;
  std::int64_t prefetch_ready = 0;
  std::int64_t chose_swap = 0;       // hybrid's choices
  std::int64_t chose_recompute = 0;
  std::int64_t backward_threads = 0; // threads other than the starting one that ran ops
  std::int64_t backward_nodes = 0;   // nodes recorded inside a backward pass
  std::int64_t backward_kept = 0;    // of those, what the program kept (.grad): forgotten
};

// A node as Python's view of it sees it (Registry.nodes).
struct NodeInfo {
  std::uint64_t handle;
  std::uint64_t key;     // the StorageImpl's address (UntypedStorage._cdata), 0 when dead
  std::uint64_t nbytes;
  std::int32_t pins;
  std::int32_t chain;    // steps of lineage (0: frozen)
  std::int32_t readers;
  std::uint8_t evicted, dead, frozen, fixed, clean, marked;
  std::uint8_t last_resort;  // dropped only where nothing else can go (Registry::replay_too_dear)
  char op[64];  // the op that made it ("aten::mm."), "" once frozen
  std::uint64_t data;  // where its bytes are now (0 when evicted)
  // The price of bringing it back (Settings::cost's unit), its dead lineage's included
  // (Note [Dead inputs cost their readers]), and the bytes of that lineage.
  double cost;
  double dead_bytes;
};

// Whether what the calling thread makes now may become a leaf's .grad: autograd is running
// an AccumulateGrad or a node with an edge into one (Note [Gradients bound for .grad] in
// backward.cpp).
bool may_become_a_grad();

// The calling thread's identity as the registry keeps it (Registry::owner_thread_, the
// per-op path's seen threads); never 0.
inline std::uint64_t thread_hash() {
  return std::hash<std::thread::id>{}(std::this_thread::get_id());
}

// The nodes an op or a replay works on (few: an op's inputs).
using NodeList = c10::SmallVector<Node*, 4>;
using KeyList = c10::SmallVector<const c10::StorageImpl*, 4>;

class Registry {
 public:
  // --- life (called from Python) ---
  // Attaches to `engine` (evict and compaction callbacks) with `settings`. "" or an error.
  std::string start(pyalloc_engine* engine, const Settings& settings);
  // Restores what the program still holds, detaches from the engine, forgets every node.
  std::string stop();
  bool active() const { return active_.load(std::memory_order_acquire); }
  // Restores every evicted storage the program still holds (oldest first). These entry
  // points throw (c10::OutOfMemoryError when a restore finds no memory); c_api.cpp turns
  // that into a failure the Python side raises as the same kind.
  void restore_all();
  // Note [Holding for compiled code]
  // Code compiled by torch.compile reads and writes tensors through their data pointers,
  // not through the dispatcher where the per-op path restores and pins what an op reads:
  // an evicted input would be read where its bytes no longer are. So a compiled region
  // holds its tensors for as long as it runs (pyalloc/compiled.py): hold() restores the
  // nodes of `keys` (StorageImpl addresses; storages that are no node are skipped) and
  // pins them, and writes their handles, each once, into `handles` (room for `count`);
  // *held is how many. release() unpins them by handle, found again even if the program
  // dropped them meanwhile. Throws, leaving nothing pinned.
  void hold(const c10::StorageImpl* const* keys, std::size_t count, Handle* handles,
                   std::size_t* held);
  void release(const Handle* handles, std::size_t count);
  // The node of `key` (a StorageImpl address; nothing if it is no node) comes back now,
  // for a read of its bytes outside the dispatcher; with `fix`, it is also frozen and
  // never leaves again (its memory was handed to another library). See Note [Storages the
  // program reads itself] in restore.cpp.
  void expose(const c10::StorageImpl* key, bool fix);
  // The storage `key` is about to be resized outside the dispatcher (its contents lost):
  // settled as for a write. See Note [Storages resized outside the dispatcher] in
  // restore.cpp.
  void before_resize(const c10::StorageImpl* key);
  // Forgets now what the program no longer holds — the nodes of a step that ended by an
  // exception, the registry's own storages only their lineage needed — instead of at the
  // next periodic sweep, so their memory is free for what comes next (empty_cache() calls
  // it: after an OOM, before a retry). Called on the program's thread, between steps.
  void collect();
  // Makes the next op or restore on any thread fail with an error saying so, once: a
  // watchdog's way out of an op that thrashes (a benchmark's time limit; a Python signal
  // handler does not run while backward is in C++). Training state is left as an
  // out-of-memory error leaves it. on=false withdraws one not delivered yet.
  void interrupt(bool on) { interrupt_.store(on, std::memory_order_relaxed); }

  // Whether storages the registry can evict are placed apart (Note [Evictable placement]
  // in allocator/src/pool.h): with the engine's option, under recompute only. Off, the
  // per-op path makes no call to say so (two engine calls an op that makes a node). Under swap and hybrid the CNN at 0.35
  // of its peak evicted 43 storages a step with it against 27 without (the small pool's
  // extra segments of each class leave the large pool less room), and prefetches hit less.
  bool places_evictables() const { return !can_swap_ && settings_.place_evictables; }

  // --- the per-op path (dispatch.cpp) ---
  // Runs `op` (redispatched below the fallback with `ks`) with the registry's work around it.
  void run_op(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack,
              const OpInfo& info);

  // `self` is about to be given another storage (aten::set_data, `x.data = y`): what was
  // recorded from the one it leaves is settled as for a write. See Note [Rebinding a
  // tensor's data] in dispatch.cpp.
  void before_rebind(const at::Tensor& self);

  // `t`'s storage where it is memory of the managed device, else nullptr (settings_ is
  // written only by start(), before active_ is set: read without the lock).
  const c10::StorageImpl* managed_storage_of(const at::TensorBase& t) const {
    const c10::StorageImpl* key = storage_of(t);
    return key && t.device().type() == settings_.device_type ? key : nullptr;
  }

  // A view's source: its node (or a sparse tensor's parts' nodes) pinned, restored first if
  // evicted, into *pinned. See Note [Views without boxing] in dispatch.cpp.
  void pin_view_source(const at::Tensor& self, NodeList* pinned);
  void unpin_view_source(const NodeList& nodes);

  // --- the engine's side (evict.cpp) ---
  std::size_t evict(const std::uint64_t* handles, std::size_t count);
  std::size_t movable(std::uintptr_t* out, std::size_t capacity);
  std::size_t relocate(const std::uintptr_t* from, const std::uintptr_t* to, std::size_t count);
  // The engine's out-of-memory report asks what the registry holds that it cannot let go
  // (Note [What the registry adds to a report] in inspect.cpp).
  std::size_t describe_oom(char* out, std::size_t capacity);
  // Under swap and hybrid, the storages `keys` (the plain tensors a Python subclass's op
  // returned inside its results) become nodes without lineage where they can: Note [What a
  // subclass's results keep inside] in registry.cpp. Returns how many it made.
  std::size_t adopt(const c10::StorageImpl* const* keys, std::size_t count);

  // --- inspection (Python's view, tests, benchmarks) ---
  std::string stats_json();
  std::vector<Handle> handles();
  bool node_info(Handle handle, NodeInfo* out);
  Handle handle_of(const void* storage_impl);
  std::string check_invariants();
  // How many times each op was replayed since start() (creations, in-place steps and the
  // replays nested in them alike), as a JSON object {"aten::mm": 12, ...}: what recompute
  // spends its time on, and so which of the model's tensors it chose to drop.
  std::string replays_json();
  void set_copy_bandwidth(double bytes_per_s);
  // bench_remat's floor: per op, allocated bytes at the op's peak less the bytes of
  // recomputable resident storages it does not read. See tools/bench_remat.py.
  void set_floor_probe(bool on);
  std::string floor_json();
  // Note [Deep replays]'s two depths (a restore nested deeper restores in order; deeper
  // still it gives up), for tests that reach them with short chains. Values below 1 keep
  // the current one. Writes the limits it replaced to `was` (two ints).
  void set_replay_limits(int in_order, int give_up, int* was);

 private:
  using Lock = std::unique_lock<std::mutex>;
  // Drops the lock for its lifetime (work that may allocate or run ops).
  class Unlocked {
   public:
    explicit Unlocked(Lock& lock) : lock_(lock) { lock_.unlock(); }
    ~Unlocked() { lock_.lock(); }
    Unlocked(const Unlocked&) = delete;
    Unlocked& operator=(const Unlocked&) = delete;

   private:
    Lock& lock_;
  };
  // Note [Releasing outside the lock]
  // ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
  // Dropping the last reference to a tensor or a storage may need the GIL (a TensorImpl
  // that owns its Python object decrefs it) and frees memory. So what a forgotten or
  // frozen node held — its recordings, with the tensors they took as arguments, and the
  // registry's own storage — is set aside under mu_ (bury_locked) and released by a
  // Burial, declared right after the Lock in each entry point: when it goes, it takes
  // what was set aside while it still holds mu_ (or takes mu_ again if the entry point
  // let it go early), drops mu_, and only then lets go of it. A thread holding the GIL
  // and waiting for mu_ can then never wait on one holding mu_ and waiting for the GIL,
  // and the common case costs no second lock.
  class Burial {
   public:
    Burial(Registry& registry, Lock& lock) : registry_(registry), lock_(lock) {}
    ~Burial();
    Burial(const Burial&) = delete;
    Burial& operator=(const Burial&) = delete;

   private:
    Registry& registry_;
    Lock& lock_;
  };
  void bury_locked(Node* node);
  // Unpins its nodes when it goes out of scope (with the lock held again by then).
  class PinScope {
   public:
    explicit PinScope(Registry& registry) : registry_(registry) {}
    ~PinScope() { release(); }
    PinScope(const PinScope&) = delete;
    PinScope& operator=(const PinScope&) = delete;
    void release() {
      registry_.unpin_all_locked(nodes);
      nodes.clear();
    }
    NodeList nodes;

   private:
    Registry& registry_;
  };

  // --- run_op's rare cases, out of its line (Note [The per-op path's footprint]) ---
  // Passes a sparse argument's dense parts on the managed device to `read` and adds them
  // to *parts; false where `t` is no sparse tensor (Note [Sparse arguments]).
  template <typename Read>
  PYALLOC_COLD bool read_sparse_parts(const at::Tensor& t, Read& read, KeyList* parts) const;
  // The first op of a thread other than the owner (counters_.backward_threads).
  PYALLOC_COLD void note_thread_locked(std::uint64_t thread);
  // Whether one of a sparse argument's `parts` is a node (the op is then foreign); a part
  // that is a remembered fill is forgotten.
  PYALLOC_COLD bool sparse_parts_read_nodes_locked(const KeyList& parts);
  // Hybrid: when the nodes an op reads in forward were last used (route_locked's gaps).
  PYALLOC_COLD void note_forward_uses_locked(const NodeList& used);
  // The floor probe (set_floor_probe): before the op, the resident bytes it does not read
  // that lineage could rebuild; after it, the floor the op's peak sets.
  PYALLOC_COLD std::uint64_t floor_probe_start_locked(const KeyList& read_keys);
  PYALLOC_COLD void floor_probe_finish_locked(const OpInfo& info, std::uint64_t droppable);
  // The recording's copies of the arguments at `positions`, which the op writes (Note
  // [What a recorded op writes]); taken before the op runs, outside the lock.
  PYALLOC_COLD static void snapshot_arguments(Recording& rec,
                                              c10::ArrayRef<std::uint16_t> positions);

  // --- nodes and their lineage: recording (registry.cpp), writes (writes.cpp), deaths
  // (liveness.cpp) ---
  Node* find_locked(Handle handle);
  Node* by_key_locked(const c10::StorageImpl* key);
  // An op's recording, made from its arguments before it runs (the stack is its results
  // after): the converted arguments, the nodes and other storages they read, and the
  // inputs' part of the cost.
  struct Pending {
    std::shared_ptr<Recording> rec;
    NodeList inputs;
    KeyList leaves;
    double in_bytes = 0;
    double flops_per_output = 0;  // per element of the first result (the "model" cost)
    std::int64_t task = -1;       // the autograd graph task it runs in (-1: none)
    bool grad_mode = false;       // at::GradMode when it ran
    bool plain = false;           // reads nothing that requires grad (Note [What plain inputs derive])
    std::size_t sparse_bytes = 0; // the parts of its sparse arguments (Note [Sparse arguments])
    // Bytes of the tensors it keeps as they are (no node, no parameter) of min_bytes or
    // more: what its recording may end up the last holder of (Note [Deaths worth a drain]).
    std::size_t droppable_bytes = 0;
    // Bytes of the storages it reads that are no node and no parameter, read by dense or
    // sparse tensors (Note [What plain inputs derive]; Note [A detached parameter is still a
    // parameter]).
    std::size_t plain_bytes = 0;
  };
  // Whether `key` is the storage of a parameter a recorded op has read (a leaf that
  // requires grad), still alive: Note [A detached parameter is still a parameter].
  bool parameter_storage_locked(const c10::StorageImpl* key) const;
  void note_parameter_storage_locked(const at::TensorBase& parameter);
  void prepare_locked(const c10::OperatorHandle& op, const OpInfo& info,
                      c10::ArrayRef<c10::IValue> args, Pending* pending);
  // New storages among `outputs` become nodes made by `pending`'s op.
  void record_creation_locked(Pending& pending, KeyList& read_keys,
                              c10::ArrayRef<c10::IValue> outputs, std::int64_t elapsed_ns);
  // Whether an op writing `targets` can extend the chain of the one it writes (else they
  // are frozen).
  bool extends_chain_locked(c10::ArrayRef<Node*> targets, bool replayable) const;
  // `targets` were written: a step of the chain (`pending`), or frozen (null).
  void record_mutation_locked(Pending* pending, c10::ArrayRef<Node*> targets,
                              std::int64_t elapsed_ns);
  void add_reader_locked(Node* reader, c10::ArrayRef<Node*> inputs, c10::ArrayRef<const c10::StorageImpl*> leaves);
  // Whether `result`, one of an op's results, is a storage that may become a node: on the
  // managed device, not one the op read (`read_keys`), not a node already, at least
  // min_bytes, freeable.
  bool can_become_node_locked(const at::Tensor& result, const KeyList& read_keys) const;
  // The part of that about the storage alone: device, node already, size, freeable (a
  // subclass's inner results: Note [What a subclass's results keep inside]).
  bool storage_can_become_node_locked(const c10::StorageImpl* key) const;
  // A new node for `storage`, made by `step` (none: frozen, without lineage), read from
  // `inputs` and `leaves`; `task` is the autograd graph task it was made in (-1: none).
  // Offered to the engine.
  Node* make_node_locked(const c10::Storage& storage, std::optional<Step> step, double cost,
                         std::int64_t task, c10::ArrayRef<Node*> inputs,
                         c10::ArrayRef<const c10::StorageImpl*> leaves,
                         double dead_bytes = 0);
  // Under swap and hybrid, what an op in a backward pass made (`outputs`): nodes without
  // lineage, which leave only as host copies (Note [Backward nodes] in backward.cpp).
  void record_bare_locked(std::int64_t task, KeyList& read_keys, c10::ArrayRef<c10::IValue> outputs);
  // Note [Fills a write makes activations] (dispatch.cpp): a fill op's result, remembered
  // with its recording; and the node it becomes when an op that may make an activation
  // reads or writes it (null if it is not remembered or died).
  void remember_fill_locked(Pending& pending, c10::ArrayRef<c10::IValue> outputs,
                            std::int64_t elapsed_ns);
  Node* promote_fill_locked(const c10::StorageImpl* key);
  // The fills `arguments` read or write that become nodes before the op (dispatch.cpp).
  void promote_fills_locked(const OpInfo& info, c10::ArrayRef<c10::IValue> arguments);
  void forget_fill_locked(const c10::StorageImpl* key);
  // Lets go of the fills that died (all of them: `all`), their recordings buried.
  void drop_fills_locked(bool all);
  // The cost of bringing back a storage `pending`'s op made (Settings::cost's unit).
  double cost_locked(const Pending& pending, c10::ArrayRef<const at::Tensor*> outputs,
                     std::int64_t elapsed_ns) const;
  // The storage `key` is about to be written: what was recorded from its contents is
  // restored (while it still can be) and frozen — unless `keep`, a write extending its
  // node's chain (See Note [Readers of an earlier version] in writes.cpp).
  void invalidate_readers(Lock& lock, const c10::StorageImpl* key, bool keep = false);
  // The same for a storage that is no node (a parameter, an input): its leaf readers.
  // `may_copy`: a write by an op, after which the storage keeps its place and size; its
  // readers may keep a copy of what it holds now instead (Note [A written leaf's readers
  // keep a copy] in writes.cpp).
  void invalidate_leaf_readers(Lock& lock, const c10::StorageImpl* key, bool may_copy = false);
  // Note [A written leaf's readers keep a copy]: true when `key`'s readers now read a copy.
  bool copy_leaf_for_readers_locked(Lock& lock, const c10::StorageImpl* key);
  // The bytes of `readers` (of `written`, a leaf) that the program still holds, with
  // lineage, and of the live nodes recorded directly from the dead ones, each less the plain
  // tensors its recordings hold.
  std::size_t live_reader_bytes_locked(c10::ArrayRef<Handle> readers,
                                       const c10::StorageImpl* written);
  // What `readers` (handles) were recorded from is about to change or be lost: each is
  // forgotten, or has its live dependents frozen, or is restored and frozen. On an error,
  // the ones not settled are passed to `put_back` and the error is rethrown.
  template <typename PutBack>
  void settle_readers_locked(Lock& lock, c10::ArrayRef<Handle> readers, PutBack&& put_back);
  // Brings back and freezes the evicted live nodes made from the dead ones among `readers`
  // when they are no larger than those dead readers: Note [Evicted dependents come back
  // first] in writes.cpp.
  void restore_evicted_dependents_locked(Lock& lock, c10::ArrayRef<Handle> readers);
  // Whether `reader` was recorded from an earlier version of `node`.
  bool reads_earlier_locked(const Node* reader, const Node* node) const;
  // Freezes `node` after settling its readers of earlier versions.
  void freeze_now(Lock& lock, Node* node);
  // Brings `node` back, freezes it and fixes it (never leaves again): see restore.cpp.
  void fix_now(Lock& lock, Node* node);
  // `dead` is about to lose its contents' source: the live nodes made from it (through
  // dead ones) are frozen instead of rebuilding it, and the dead chain goes. False, and
  // nothing changed, when one of them is evicted. See Note [Writes under dead readers].
  bool freeze_dependents_locked(Lock& lock, Node* dead);
  // Note [Lineage that outlives its iteration] (backward.cpp).
  void settle_old_lineage_locked(Lock& lock);
  bool feeds_read_dependent_locked(const Node* dead);
  // Whether a recorded op that is neither dead nor dying read `node`.
  bool has_live_reader_locked(const Node* node);
  // Note [Lineage that holds more than it can free] (backward.cpp).
  void settle_costly_lineage_locked(Lock& lock);
  // The bytes on the device that only `dead`'s recordings keep: tensor arguments nothing
  // else references, and frozen inputs held for readers that are all dead. Each storage
  // is counted once per call of settle_costly_lineage_locked (`counted`).
  // `occurrences`: how often each tensor argument appears in dead nodes' recordings.
  std::size_t bytes_only_lineage_holds_locked(
      const Node* dead, const ska::flat_hash_map<const void*, std::size_t>& occurrences,
      ska::flat_hash_set<const void*>& counted);
  // What `dead` feeds, through dead readers (walked into) to the live ones (not beyond),
  // `settling_` passed over: the live nodes, resident and evicted, the dead ones on the
  // way, and whether one of those is pinned (being replayed: not walked into).
  struct Dependents {
    c10::SmallVector<Handle, 4> live, evicted;
    c10::SmallVector<Handle, 16> dead;
    bool replaying = false;
  };
  Dependents dependents_locked(const Node* dead);
  // The node whose readers are being settled (0: none), which freeze_dependents_locked
  // passes over: See Note [A written node keeps its chain while its readers settle] in
  // writes.cpp. Settling sets it for a scope and puts back the one before (settling nests).
  Handle settling_ = 0;  // guarded by mu_
  class Settling {
   public:
    Settling(Registry& reg, Handle node) : reg_(reg), was_(reg.settling_) { reg.settling_ = node; }
    ~Settling() { reg_.settling_ = was_; }
    Settling(const Settling&) = delete;
    Settling& operator=(const Settling&) = delete;

   private:
    Registry& reg_;
    Handle was_;
  };
  void freeze_locked(Node* node);
  bool has_readers_locked(const Node* node);
  // Whether anything besides the registry holds the node's storage.
  bool program_holds_locked(const Node* node) const;
  // The program's storage of `node` is gone: its memory went with it (Note [Who holds a
  // storage]).
  void mark_dead_locked(Node* node);
  // mark_dead_locked's state change alone: no charge.
  void set_dead_locked(Node* node);
  // Its live readers now pay for rebuilding it too: See Note [Dead inputs cost their readers].
  void charge_readers_locked(Node* dead);
  // One death's walk; readers it finds dead unnoticed go on `found_dead` (Note [Deaths found
  // by a charge]).
  void charge_walk_locked(Node* dead, c10::SmallVectorImpl<Handle>& found_dead);
  // Lets every kept frontier lapse once frontiers_ is full (Note [Charging a batch of
  // deaths]); called only where no walk is under way.
  void new_frontier_epoch_if_full_locked();
  // Walks what was recorded from `start`, and from those, and so on: each node with
  // lineage once, `start` never. `visit(reader)` says whether to go on through the
  // reader's own readers (kInto), not (kOver), to go on through the nodes its own charge
  // reached instead (kFrontier: See Note [Charging a batch of deaths]), or to end the walk
  // (kStop: returns false). One walk at a time (the stamp and the work list are shared):
  // `visit` must not start another (mark_dead_locked does).
  enum class Walk { kInto, kOver, kFrontier, kStop };
  template <typename Visit>
  bool walk_readers_locked(const Node* start, Visit&& visit);
  // A dead node's contents come back in `storage`, the registry's own from now on.
  void adopt_locked(Node* node, c10::intrusive_ptr<c10::StorageImpl> storage);
  void forget_locked(Node* node);
  // The engine noted storages that died (See Note [Noticing deaths] in liveness.cpp):
  // forgets those no recorded op needs, and what only they needed.
  // `all`: take every death noted so far (else only once enough have gathered).
  void notice_deaths_locked(bool all);
  // Forgets the nodes of `work` (handles) that nothing needs any more, and then whatever
  // only they read.
  void release_dead_locked(c10::SmallVectorImpl<Handle>& work);
  // Looks again at the inputs of nodes frozen since the last look (unread_), and lets go
  // of a live node's `held` once nothing reads it: See Note [Inputs a frozen node no longer
  // reads] in writes.cpp.
  void revisit_unread_locked();
  void let_go_if_unread_locked(Node* node);
  // Forgets `node` (dead) and every node it feeds when all of them are dead and unheld:
  // a cycle through readers of earlier versions. Their inputs go to `work`.
  bool forget_dead_cycle_locked(Node* node, c10::SmallVectorImpl<Handle>& work);
  // Looks at every node: forgets those nothing needs and evicts those only lineage needs.
  // The backstop of notice_deaths_locked(), every few thousand ops and whenever the engine
  // asks for memory.
  void sweep_locked(bool tidy);

  // --- evict.cpp: marks and eviction ---
  void mark_locked(Node* node);
  // The same, but where the storage has no data it only returns false (the caller decides
  // about a death: Note [Deaths found by a charge]); true otherwise.
  bool try_mark_locked(Node* node);
  // A use, for the engine's staleness clock: see Note [Touches].
  void touch_locked(Node* node);
  void unmark_locked(Node* node);
  // Under recompute: its dead lineage outweighs a share of the budget, or it may become a
  // leaf's .grad, so it is dropped only as a last resort. See Note [A restore needs its dead
  // lineage's memory] in evict.cpp and Note [Gradients bound for .grad] in backward.cpp.
  bool replay_too_dear(const Node* node) const;
  void refresh_budget_locked();  // budget_ from the engine
  double eviction_cost_locked(const Node* node) const;
  enum class Route { kNone, kFree, kSwap, kDrop };
  Route route_locked(Node* node, bool eager);
  bool evict_locked(Node* node, bool eager);
  // Frees the data of `node`'s storage `s` (evicting it).
  void free_data_locked(Node* node, c10::StorageImpl* s);
  void pin_locked(Node* node) { ++node->pins; }
  void unpin_locked(Node* node);

  // --- restore.cpp: bringing storages back ---
  // Pins `nodes` with every one resident; see the definition for the order.
  void pin_all(Lock& lock, c10::ArrayRef<Node*> nodes);
  // Pins every node once, in two passes: first the evicted ones (restoring each) or the
  // resident ones, then the rest, restoring any evicted meanwhile. pin_all's last resort,
  // and how a replay pins its inputs (Note [Pinning inside replays] in restore.cpp).
  void pin_in_two_passes(Lock& lock, c10::ArrayRef<Node*> nodes, bool evicted_first);
  void unpin_all_locked(c10::ArrayRef<Node*> nodes);
  void restore(Lock& lock, Node* node);  // the caller pinned it
  void restore_now(Lock& lock, Node* node);
  // Restores, oldest first, the evicted nodes `node`'s replay would rebuild through
  // (Note [Deep replays]).
  void restore_lineage_in_order(Lock& lock, Node* node);
  // Replays one recorded op; `target` is the node an in-place step rebuilds (in `into`
  // instead of its own storage, if given). Returns its results (tensors only, in order).
  // `only_output`: the one result the caller keeps, where the op can be told to skip the
  // others (Note [Replaying one result of a backward op]).
  std::vector<at::Tensor> replay(Lock& lock, const Step& step, Node* target,
                                 c10::intrusive_ptr<c10::StorageImpl> into = {},
                                 std::optional<std::uint32_t> only_output = std::nullopt);
  // Replays a chain's creating step: the result that is the chain's storage.
  at::Tensor replay_creation(Lock& lock, const Step& step);
  // The contents `node` had at `version` (an earlier one), rebuilt from the first steps
  // of its chain into a storage of their own. See Note [Readers of an earlier version].
  c10::intrusive_ptr<c10::StorageImpl> version_of(Lock& lock, Node* node, std::uint32_t version);
  // Moves (or copies) `fresh`'s bytes into `node`'s storage, which becomes resident.
  void install(Lock& lock, Node* node, const at::Tensor& fresh);
  at::Tensor view_of_locked(Node* node, const Ref& ref);

  // --- swap.cpp: host copies, prefetch, hybrid ---
  std::uintptr_t compute_stream() const;
  bool swap_out_locked(Node* node);
  // Gives `node`'s storage (or, dead, a storage of the registry's own) memory of its size;
  // without `may_evict` it fails rather than evict (a prefetch). Unlocks to allocate.
  bool allocate_data(Lock& lock, Node* node, bool may_evict);
  void swap_in(Lock& lock, Node* node, bool wait, bool allocated);
  void arrive_locked(Node* node);
  void drop_copy_locked(Node* node);
  bool shed_copies_locked(std::size_t needed);
  void prefetch_after(Lock& lock, Node* node);
  void backward_use_locked(Node* node);
  void end_iteration_locked();
  // --- restore.cpp: Note [Replays that dominate an iteration] ---
  void warn_if_replays_dominate_locked();

  // --- backward.cpp: what a backward pass creates (Note [Backward nodes]) ---
  // The op runs inside autograd graph task `task`: its first op arranges for end_backward.
  // `previous`: the task of the thread's previous op (-1: none), the pass `task` runs
  // inside if it is new and that one is still open.
  void enter_backward_locked(std::int64_t task, std::int64_t previous);
  void end_backward(std::int64_t task, std::uint64_t generation);
  // settle_costly: settle costly lineage too (end_backward does it apart, with the GIL
  // taken first: Note [Python's references under the registry's mutex] in backward.cpp).
  // False where `task` was no open pass (ended already): nothing was done.
  bool end_backward_locked(Lock& lock, std::int64_t task, bool settle_costly = true);
  // Passes that ended by an exception (no final callback ran).
  void end_stale_backwards_locked(Lock& lock);
  static std::int64_t now_ns();
  // Throws the error interrupt() asked for, if one is pending (one relaxed load otherwise).
  void check_interrupt() {
    if (interrupt_.load(std::memory_order_relaxed) && interrupt_.exchange(false))
      TORCH_CHECK(false, "pyalloc: interrupted (Registry.interrupt(): a watchdog stopped an op "
                         "that was recomputing for too long; the budget is too small to train "
                         "at a useful speed)");
  }

  std::mutex mu_;
  std::atomic<bool> active_{false};
  std::atomic<bool> interrupt_{false};  // See interrupt()
  std::uint64_t generation_ = 0;                // guarded by mu_; bumped by start()
  std::uint64_t iterations_ = 0;                // backward passes ended (outermost); mu_
  // counters_.ops and .recomputes when the last iteration ended; mu_
  std::int64_t ops_at_iteration_ = 0, recomputes_at_iteration_ = 0;
  pyalloc_engine* engine_ = nullptr;            // guarded by mu_
  Settings settings_;                           // guarded by mu_
  bool can_swap_ = false;                       // policy swap or hybrid
  bool can_relocate_ = false;                   // nodes without lineage may leave (host pool)
  bool saw_tangents_ = false;                   // an op read a dual tensor (forward-mode AD)
  std::atomic<bool> saw_subclasses_{false};     // an op read a Python tensor subclass
  std::uint64_t budget_ = 0;                    // guarded by mu_; the engine's, at start and each evict()
  double copy_bw_ = 0;                          // bytes/s of one swap copy
  NodeTable nodes_;  // guarded by mu_
  // Set aside for a Burial (Note [Releasing outside the lock]); buried_: non-empty.
  std::vector<std::shared_ptr<const Recording>> graveyard_;  // guarded by mu_
  std::vector<c10::intrusive_ptr<c10::StorageImpl>> graveyard_storages_;  // guarded by mu_
  // Inputs of nodes frozen since revisit_unread_locked() last ran.
  c10::SmallVector<Handle, 16> unread_;  // guarded by mu_
  std::atomic<bool> buried_{false};
  // Memory for Recordings, one per recorded op. They are made an op at a time and
  // released a hundred or more at a time at the end of a step, which overflows malloc's
  // per-thread caches (it showed as the most expensive part of recording an op); a free
  // list recycles them. It has a lock of its own: a Recording is released wherever its
  // last reference goes, deliberately not under mu_ (Note [Releasing outside the lock]).
  LockedFreeList recordings_;
  ska::flat_hash_map<const c10::StorageImpl*, Node*> by_key_;  // guarded by mu_
  // Fills not yet read or written by an op that may make an activation (guarded by mu_;
  // the weak reference keeps the StorageImpl's address from being reused while listed).
  struct Fill {
    c10::weak_intrusive_ptr<c10::StorageImpl> weak;
    std::shared_ptr<Recording> rec;
    KeyList leaves;
  };
  using Fills = ska::flat_hash_map<const c10::StorageImpl*, Fill>;
  Fills fills_;
  // Erases a fill, its recording buried (Note [Releasing outside the lock]); the next one.
  Fills::iterator bury_fill_locked(Fills::iterator it);
  // Storages that are not nodes but were read by recorded ops (parameters, inputs, small
  // tensors): the readers to invalidate when one is written (the optimizer's step).
  ska::flat_hash_map<const c10::StorageImpl*, std::vector<Handle>> leaf_readers_;
  // The storages of min_bytes or more of the parameters recorded ops have read, held weakly
  // (guarded by mu_; the dead are dropped by the tidy sweep): Note [A detached parameter is
  // still a parameter] in registry.cpp.
  ska::flat_hash_map<const c10::StorageImpl*, c10::weak_intrusive_ptr<c10::StorageImpl>>
      parameter_storages_;
  // The backstop sweep runs every kSweepEvery ops at least (and every 8 ops per node):
  // deaths the engine could not note (a storage that died while evicted or unmarked)
  // wait that long.
  static constexpr std::int64_t kSweepEvery = 4096;
  std::int64_t next_sweep_ = 0;                 // guarded by mu_; in ops
  // Nodes whose recordings keep tensors the program may drop: a death among them is
  // drained at once (Note [Deaths worth a drain] in liveness.cpp). Guarded by mu_.
  c10::SmallVector<Handle, 16> watched_;
  void watch_death_locked(const Node* node);
  bool watched_died_locked();
  std::uint64_t deaths_seen_ = 0;               // guarded by mu_; freed_marked_count read
  std::int64_t last_evict_sweep_ = -1;          // guarded by mu_; the op of the last one
  Counters counters_;                           // guarded by mu_
  // Restores replaying lineage right now, nested ones counted (guarded by mu_; Note [What
  // the registry adds to a report] in inspect.cpp).
  int replays_in_flight_ = 0;
  std::unordered_map<c10::OperatorName, std::int64_t> replays_by_op_;  // guarded by mu_
  std::uint64_t ticks_ = 0;  // guarded by mu_; marks and touches sent (See Note [Touches])
  // walk_readers_locked's (guarded by mu_): its stamp and its work list, each entry a
  // node whose readers are next, or (node null) a range of frontiers_.
  struct WalkFrom {
    const Node* node;
    std::uint32_t begin, end;
  };
  std::uint64_t charge_visit_ = 0;
  std::vector<WalkFrom> charge_stack_;
  std::uint64_t settle_visit_ = 0;  // settle_costly_lineage_locked's walks (Recording::settle_visit)
  // Note [Charging a batch of deaths]: the nodes each death's charge reached (ranges of
  // frontiers_, valid while their epoch lasts).
  std::uint64_t frontier_epoch_ = 1;
  std::vector<Handle> frontiers_;
  std::uint64_t owner_thread_ = 0;              // the thread that started it
  std::vector<std::uint64_t> seen_threads_;     // guarded by mu_
  // Swap/hybrid: what the previous iteration did, by creation ordinal.
  std::int64_t ordinal_ = 0;
  std::unordered_map<std::int64_t, Handle> by_ordinal_;
  bool in_backward_ = false;
  // Graph tasks whose end is arranged for, and the nodes each made (Note [Backward nodes]).
  std::vector<std::int64_t> open_tasks_;
  // A pass that began inside another (task, the one it ran in): Note [Passes inside a pass].
  std::vector<std::pair<std::int64_t, std::int64_t>> enclosing_;
  std::vector<std::pair<std::int64_t, Handle>> backward_nodes_;
  std::vector<std::int64_t> order_cur_, order_prev_;
  std::unordered_map<std::int64_t, std::size_t> pos_prev_;
  std::map<std::pair<std::int64_t, std::size_t>, std::int64_t> gaps_cur_, gaps_prev_;
  // Note [Deep replays] (set_replay_limits).
  std::atomic<int> replay_in_order_{32}, replay_give_up_{256};
  // The floor probe (set_floor_probe).
  bool floor_probe_ = false;
  std::uint64_t floor_bytes_ = 0, floor_allocated_ = 0, floor_droppable_ = 0;
  std::string floor_op_;
};

// Used by writes.cpp and liveness.cpp, so defined here.
template <typename Visit>
bool Registry::walk_readers_locked(const Node* start, Visit&& visit) {
  const std::uint64_t stamp = ++charge_visit_;
  charge_stack_.clear();
  charge_stack_.push_back({start, 0, 0});
  while (!charge_stack_.empty()) {
    const WalkFrom from = charge_stack_.back();
    charge_stack_.pop_back();
    const std::size_t count = from.node ? from.node->readers.size() : from.end - from.begin;
    for (std::size_t i = 0; i < count; ++i) {
      // (frontiers_ may grow during the visits: indexed afresh each time.)
      const Handle h = from.node ? from.node->readers[i] : frontiers_[from.begin + i];
      Node* reader = find_locked(h);
      if (!reader || reader == start || !reader->lineage() || reader->charge_visit == stamp)
        continue;
      reader->charge_visit = stamp;
      switch (visit(reader)) {
        case Walk::kInto: charge_stack_.push_back({reader, 0, 0}); break;
        case Walk::kOver: break;
        case Walk::kFrontier:
          charge_stack_.push_back({nullptr, reader->frontier_begin, reader->frontier_end});
          break;
        case Walk::kStop: return false;
      }
    }
  }
  return true;
}

// The process-wide registry.
Registry& registry();

}  // namespace pyalloc::registry
