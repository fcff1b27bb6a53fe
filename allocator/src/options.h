// options.h — every tunable of the engine, in one table.
//
// The table below is the single source of truth: the Options struct, its defaults, the
// parser and to_string() (options.cpp), the documentation that Python renders
// (pyalloc.options_table(), docs/design.md) and the header of `pyalloc-stats` are all
// generated from it. Options reach the engine as a string "key:value,key:value"
// (PYALLOC_CONF, and PYALLOC_<NAME> for any one option, merged with install(**kwargs) in
// Python) and are parsed once, when an engine is created; nothing reads a global at import.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "format.h"

namespace pyalloc {

// X(name, kind, Type, default_text, choices, doc)
//   kind: kSize  — bytes, with an optional unit: 512, 64KiB, 1.5GiB, 2GB   (std::size_t)
//         kBudget — a size, or a fraction of device memory: 0.8 or 80%      (Budget)
//         kBool  — true/false/1/0/on/off                                    (bool)
//         kInt   — a non-negative integer                                   (std::size_t)
//         kChoice — one of `choices` ("a, b, c"): the word (std::string), or its
//                   position in the list (an enum whose values follow the list)
//         kFraction — a number in [0, 1]                                     (double)
//   Type: the member of Options that holds the value (named `name`).
//   default_text: parsed like any value, so a default can never be out of range.
// Rules no kind expresses (max_split_size above 20 MiB, sim_capacity above 0) are in
// options.cpp, check_rule().
#define PYALLOC_OPTIONS(X)                                                                  \
  X(budget, kBudget, Budget, "1.0", "",                                                     \
    "Hard cap on reserved bytes: a size (\"8GiB\") or a fraction of device memory (0.8, "   \
    "\"80%\"). Requests that would push reserved bytes past it are served by reclaiming "   \
    "cached memory, or fail with an OOM report.")                                           \
  X(sim_capacity, kSize, std::size_t, "4GiB", "",                                           \
    "Simulated device only: its total memory. Host memory is committed only as it is "      \
    "used. A fractional budget is a fraction of this.")                                     \
  X(sim_sync_stream0, kBool, bool, "true", "",                                              \
    "Simulated device only: stream 0 runs work synchronously (as CPU tensors do), so blocks " \
    "freed on it are idle at once. Replays of GPU traces turn it off to keep GPU semantics.") \
  X(max_split_size, kSize, std::size_t, "0", "",                                            \
    "Cached blocks at least this large are never split for smaller requests (0: no "        \
    "limit; otherwise more than 20 MiB). Same meaning as PyTorch's max_split_size_mb.")     \
  X(stitch, kBool, bool, "true", "",                                                        \
    "When no free block holds a request and the budget has no room for a segment, map free " \
    "2 MiB chunks from several segments into one new range (virtual memory stitching).")    \
  X(stitch_first, kBool, bool, "false", "",                                                 \
    "With stitch: when no free block holds a request but free 2 MiB chunks of the cached "  \
    "segments do, stitch them rather than map a new segment (where they hold 20 MiB or "    \
    "more of it but not all, map only the rest and stitch), and grow by segments no larger " \
    "than the request, so reserved memory grows only when free memory falls short.")        \
  X(keep_stitched, kBool, bool, "true", "",                                                 \
    "With stitch: a freed stitched range stays mapped (up to 16 of them), and the next "     \
    "stitch of exactly the same free chunks takes it again instead of mapping a new range, " \
    "so a stitch that recurs every training step maps nothing after the first. Kept "        \
    "ranges are unmapped before any memory is released.")                                    \
  X(expandable, kBool, bool, "false", "",                                                   \
    "Large pool: one segment that grows by mapping 2 MiB chunks at its end (and gives free " \
    "chunks at its end back on release), instead of a new segment per cache miss, as "      \
    "PyTorch's expandable_segments; blocks freed next to each other merge across what "     \
    "would have been segment boundaries. max_split_size does not apply inside it.")         \
  X(lifetime_classes, kBool, bool, "true", "",                                              \
    "Place small blocks by lifetime: what is allocated while the model is built and inside " \
    "optimizer steps (install() tells the engine) goes only into small segments holding "   \
    "such blocks or into empty ones, so it does not pin segments of gradients and "         \
    "activations.")                                                                         \
  X(evictable_placement, kBool, bool, "false", "",                                          \
    "Under a registry: small storages it can evict go to small segments of their own (and " \
    "other short-lived requests avoid those), so evicting them frees whole segments that "  \
    "large requests can use. Never refuses memory: with no room in its class, any hole.")   \
  X(compact, kBool, bool, "true", "",                                                       \
    "Under a registry, when nothing is left to evict: move live storages it can move (device" \
    " to device, contents and views kept) out of a run of blocks that then holds the "      \
    "request, before reporting an OOM (compaction).")                                       \
  X(evict_strategy, kChoice, EvictStrategy, "window", "dtr, dte, window",                   \
    "How victims are chosen when memory must be reclaimed from evictable tensors: dtr "     \
    "(cheapest cost/(bytes x staleness), DTR), dte (the same counting free neighbours, "    \
    "MegEngine's DTE), or window (the cheapest contiguous run of evictable and free "       \
    "blocks that holds the request, as Coop does).")                                        \
  X(thrash_guard, kBool, bool, "false", "",                                                 \
    "evict_strategy window: when the victims of its in-place rounds keep coming back (85% " \
    "within 64 ticks, over four samples of 32), stop evicting in place for a while. Off by " \
    "default: it also fires where windows still train, and then costs time and memory.")    \
  X(evict_threshold, kFraction, double, "0", "",                                            \
    "Evict proactively once allocated bytes exceed this fraction of the budget, down to it " \
    "(0: only when a request does not fit).")                                               \
  X(policy, kChoice, std::string, "none", "none, recompute, swap, hybrid",                  \
    "What pyalloc does when memory is short, besides reclaiming its cache: none; recompute " \
    "(evict activations and recompute them on use: the tensor registry); swap "             \
    "(copy them to the host pool on a side stream and back before use); or hybrid (swap "   \
    "what the copy can hide behind compute, recompute the rest).")                          \
  X(host_pool, kSize, std::size_t, "0", "",                                                 \
    "Bytes of host memory for tensors copied out of the device, allocated once (pinned on " \
    "CUDA). policy swap/hybrid: allocated when the policy starts; 0: as much as the device " \
    "has, at most a quarter of the host's RAM. policy recompute with spill: allocated at "  \
    "the first spill; 0: as much as the budget, at most a sixteenth of the host's RAM.")    \
  X(spill, kBool, bool, "true", "",                                                         \
    "policy recompute: what it cannot recompute within the budget (a storage with no "      \
    "lineage, or one whose replay would rebuild more dead lineage than the budget can "     \
    "spare) leaves as a copy in the host pool (host_pool), as may the tangents of forward-" \
    "mode AD and what Python tensor subclasses make inside. false: no host memory; such "   \
    "storages stay on the device, and the too-dear ones are dropped only as a last resort.") \
  X(prefetch, kInt, std::size_t, "4", "",                                                   \
    "policy swap/hybrid: how many swapped-out tensors backward brings back ahead of use, in " \
    "the order the previous iteration used them (0: only on use). Never evicts for it.")    \
  X(min_evictable, kSize, std::size_t, "1KiB", "",                                          \
    "Any policy: storages smaller than this are never evicted (they free little and "       \
    "cost a search and a replay each).")                                                    \
  X(remat_cost, kChoice, std::string, "model", "model, time, bytes",                        \
    "Any policy: how the cost of recomputing a storage is estimated: model (bytes "         \
    "moved plus FLOPs of matmuls and convolutions, deterministic), time (host clock around " \
    "the op; meaningful only where ops are synchronous), or bytes (its size).")             \
  X(inplace_update, kBool, bool, "false", "",                                               \
    "INPLACE_UPDATE mode: parameters, gradients and optimizer state live in a persistent "  \
    "region of their own and are updated in place (SGD, Adam, AdamW: no allocation inside " \
    "step()); zero_grad() zeroes in place. Also PYALLOC_INPLACE_UPDATE=1. Read by Python.") \
  X(trace_capacity, kInt, std::size_t, "0", "",                                             \
    "Record the most recent N allocator events from the engine's creation (0: off). "       \
    "pyalloc.record_trace() turns recording on for a block of code instead.")               \
  X(check_invariants, kBool, bool, "false", "",                                             \
    "Run check_invariants() after every allocator operation and abort with a report on "    \
    "the first violation. Slow; for tests and debugging.")

enum class OptionKind { kSize, kBudget, kBool, kInt, kChoice, kFraction };

// Values follow evict_strategy's choices in the table.
enum class EvictStrategy { kDtr, kDte, kWindow };

// A budget is either absolute bytes or a fraction of device memory; exactly one is set.
struct Budget {
  std::size_t bytes = 0;  // 0: `fraction` of the device
  double fraction = 0;
};

struct Options {
#define PYALLOC_MEMBER(name, kind, Type, def, choices, doc) Type name{};
  PYALLOC_OPTIONS(PYALLOC_MEMBER)
#undef PYALLOC_MEMBER

  // The table's defaults (a default-constructed Options holds zeroes, not these).
  static Options defaults();

  // Parses "key:value,..." on top of `*out`. Returns "" on success, otherwise a message
  // that names the offending key or value and the accepted form.
  static std::string parse(const std::string& text, Options* out);
  // "key:value,..." with every option, in table order (what the engine is running with);
  // parse() reads it back to the same Options.
  std::string to_string() const;
  // The table as JSON: [{"name":..,"kind":..,"default":..,"choices":..,"doc":..}, ...]
  static std::string table_json();
  // Resolves the budget against a device's total memory.
  std::size_t budget_for(std::size_t device_total_bytes) const;
};

// Parses "8GiB", "1.5 MB", "4096" into bytes. Returns false for anything else
// (negative, non-finite, unknown unit, overflow).
bool parse_size(const std::string& text, std::size_t* bytes);
const char* strategy_name(EvictStrategy s);

}  // namespace pyalloc
