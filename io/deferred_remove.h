// Removing a file whose last link goes away makes the kernel free its cached pages and
// its blocks, which takes about a millisecond per 5 MB on ext4. A checkpoint save that
// replaces an older version keeps that old version alive under a hidden name until the
// new one is in place, then hands the hidden name to this background remover, so the
// save returns without paying for the deletion. Readers that hold the old file open are
// unaffected (POSIX unlink semantics); nothing is ever overwritten in place. Every
// removal, listing and stat goes through the Env of the save or run directory that asks.
#pragma once
#include <string>
#include <vector>

#include "engine/io/env.h"

namespace engine {

// Queues `path` for env.remove() on a background thread (started on first use). Errors
// are ignored: the file is a hidden leftover, and the sweep below retries. `env` must
// live until the removal is done (finish_pending_removals(env)).
void remove_later(Env& env, std::string path);

// Blocks until every queued removal has been attempted. Also runs at process exit. In a
// child made by fork() removals happen at once and this returns at once.
void finish_pending_removals();
// The same for the removals queued through `env` only.
void finish_pending_removals(const Env& env);

// The hidden name under which a save keeps the version of `name` it replaces:
// ".<name>.old.<pid>.<n>" in the same directory.
std::string replaced_version_name(const std::string& dir_prefix, const std::string& name);

// Queues for removal the hidden files that saves in `dir` leave behind when their
// process dies before cleaning up: ".<name>.old.<pid>.<n>" whose pid no longer runs
// here, and ".<name>.tmp.<pid>" likewise once an hour old (for names ending .h5 or .jsonl) (the directory may be shared
// with other machines, whose pids mean nothing here). Runs once per directory per
// process.
void sweep_leftovers_once(Env& env, const std::string& dir);

// For the holder of the run directory's lock (engine/run/run_lock.h), which proves that no
// other writer is at work there: removes now, whatever their age or pid, the temporary
// files and hidden old versions that writers which died left in `dir` (SIGKILL, SIGXFSZ,
// a power cut), and the files `also` names (relative to dir: the layer above knows its
// own fixed-name temporaries). This process's own files are left alone. Returns how many
// were removed.
int sweep_dead_writers(Env& env, const std::string& dir, const std::vector<std::string>& also = {});

}  // namespace engine
