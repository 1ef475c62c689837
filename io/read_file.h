// Private to the engine: reading a file through an Env (engine/io/env.h), for the readers
// that want its bytes as they are (metrics.jsonl, a checkpoint's hash).
#pragma once
#include <cstddef>
#include <functional>
#include <string>

#include "engine/io/env.h"

namespace engine {

// Hands the bytes of `path` to `take`, in order, in pieces of at most `piece` bytes.
// 0, or the errno of the open or read that failed.
int read_file_in_pieces(Env& env, const std::string& path, std::size_t piece,
                        const std::function<void(const char* data, std::size_t n)>& take);

// The whole of `path` into `content`: 0, or the errno of the failure.
int read_whole_file(Env& env, const std::string& path, std::string& content);

}  // namespace engine
