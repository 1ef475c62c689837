// Private to io/: atomic, durable replacement of a file (checkpoints, metrics.jsonl).
#pragma once
#include <sys/types.h>

#include <cstddef>
#include <functional>
#include <string>

namespace engine {

// pwrite of all `n` bytes at `offset`; 0 or the errno of the failure.
int write_fully_at(int fd, const unsigned char* data, std::size_t n, off_t offset);

// Writes a new file under `path` atomically: `write_content(fd)` fills a temporary
// file in the same directory (returning 0 or an errno), which is fsynced, renamed over
// `path`, and the directory fsynced. On failure the previous file at `path` is
// untouched and a CheckpointError names `path`.
void atomic_write(const std::string& path, const std::function<int(int)>& write_content);

}  // namespace engine
