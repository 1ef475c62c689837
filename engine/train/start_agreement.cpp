#include "engine/train/start_agreement.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <vector>

#include "io/read_file.h"

namespace engine {
namespace {

// A 64-bit hash of bytes, 8 at a time (multiply-rotate, then an avalanche at the end):
// to catch accidental differences between ranks, not an adversary.
class Hash64 {
 public:
  void add(const void* data, std::size_t n) {
    const auto* p = static_cast<const unsigned char*>(data);
    std::size_t i = 0;
    for (; i + 8 <= n; i += 8) {
      uint64_t w;
      std::memcpy(&w, p + i, 8);
      mix(w);
    }
    uint64_t tail = 0;
    std::memcpy(&tail, p + i, n - i);
    mix(tail ^ (static_cast<uint64_t>(n - i) << 56));
    mix(static_cast<uint64_t>(n));  // lengths too: "ab"+"c" is not "a"+"bc"
  }
  void add(const std::string& s) { add(s.data(), s.size()); }
  uint64_t value() const {
    uint64_t h = h_;
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdULL;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ULL;
    h ^= h >> 33;
    return h;
  }

 private:
  void mix(uint64_t w) {
    h_ ^= w * 0x9e3779b97f4a7c15ULL;
    h_ = ((h_ << 31) | (h_ >> 33)) * 0xbf58476d1ce4e5b9ULL;
  }
  uint64_t h_ = 0x243f6a8885a308d3ULL;
};

// The config as compared: paths that may differ between nodes left out (their contents
// are compared as the data and the checkpoint).
nlohmann::json comparable_config(const Config& cfg) {
  nlohmann::json j = config_to_json(cfg);
  if (j.contains("data")) j["data"].erase("dir");
  if (j.contains("checkpoint")) j["checkpoint"].erase("dir");
  return j;
}

void flatten(const nlohmann::json& j, const std::string& prefix, std::map<std::string, std::string>& out) {
  if (j.is_object() && !j.empty()) {
    for (auto it = j.begin(); it != j.end(); ++it)
      flatten(it.value(), prefix.empty() ? it.key() : prefix + "." + it.key(), out);
  } else {
    out[prefix] = j.dump();
  }
}

// "optimizer.lr = 0.02 (rank 0: 0.05)" for every key where `mine` differs from rank 0's.
std::string config_differences(const nlohmann::json& mine, const nlohmann::json& rank0) {
  std::map<std::string, std::string> a, b;
  flatten(mine, "", a);
  flatten(rank0, "", b);
  std::string out;
  auto add = [&](const std::string& key, const std::string& here, const std::string& there) {
    out += (out.empty() ? "" : ", ") + key + " = " + here + " (rank 0: " + there + ")";
  };
  for (const auto& [key, value] : a) {
    const auto it = b.find(key);
    if (it == b.end()) add(key, value, "absent");
    else if (it->second != value) add(key, value, it->second);
  }
  for (const auto& [key, value] : b)
    if (!a.count(key)) add(key, "absent", value);
  return out;
}

// What identifies this build for the start agreement, in words: the version, the
// compiler, the MPI library and whether the CUDA backend is in. Its hash is compared;
// the words name both builds when they differ.
std::string build_description() {
  std::string mpi = mpi_library_version();
  if (const auto end = mpi.find_first_of(",\n"); end != std::string::npos) mpi.resize(end);  // Open MPI's first line
#ifdef ENGINE_WITH_CUDA
  const char* cuda = "CUDA backend on";
#else
  const char* cuda = "CPU-only";
#endif
  return std::string("engine ") + ENGINE_VERSION + " (" + cuda + ", compiler " + __VERSION__ + ", " + mpi + ")";
}

uint64_t build_hash() {
  Hash64 h;
  h.add(std::string(ENGINE_VERSION));
  h.add(std::string(__VERSION__));  // the compiler
  h.add(mpi_library_version());
#ifdef ENGINE_WITH_CUDA
  h.add(std::string("cuda"));
#else
  h.add(std::string("no cuda"));
#endif
  return h.value();
}

void hash_split(Hash64& h, const SplitData& s) {
  for (const Tensor* t : {&s.images, &s.labels}) {
    if (!t->defined() || t->nbytes() == 0) {
      h.add("", 0);
      continue;
    }
    if (t->device().is_cpu()) {
      h.add(t->raw(), t->nbytes());
    } else {
      const Tensor host = t->to(Device::cpu());
      h.add(host.raw(), host.nbytes());
    }
  }
}

// The bytes of the file, 0 for "" (no checkpoint: starting fresh).
uint64_t file_hash(Env& env, const std::string& path) {
  if (path.empty()) return 0;
  Hash64 h;
  if (read_file_in_pieces(env, path, std::size_t(1) << 20, [&](const char* data, std::size_t n) { h.add(data, n); }) != 0)
    throw std::runtime_error(path + ": cannot read the checkpoint to resume from");
  return h.value() | 1;  // never 0, which means "none"
}

std::string rank_list(const std::vector<int>& ranks) {
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  for (std::size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s;
}

double ms_since(Env& env, std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double, std::milli>(env.monotonic_now() - t).count();
}

}  // namespace

StartAgreement agree_on_start(Collective& comm, const Config& cfg, Dataset& data,
                              const std::string& checkpoint_path, Env* env_given) {
  StartAgreement out;
  const int w = comm.size();
  if (w == 1) return out;
  Env& env = env_or_posix(env_given);
  const auto t0 = env.monotonic_now();

  const nlohmann::json config = comparable_config(cfg);
  const std::string config_text = config.dump();
  enum Item { kConfig, kBuild, kData, kCheckpoint, kItems };
  std::vector<uint64_t> mine(kItems);
  {
    Hash64 h;
    h.add(config_text);
    mine[kConfig] = h.value();
  }
  mine[kBuild] = build_hash();
  {
    // The test split is read now instead of after training (it is kept: read once).
    const auto load = env.monotonic_now();
    data.get(Split::Test);
    out.test_load_ms = ms_since(env, load);
    Hash64 h;
    for (const Split s : {Split::Train, Split::Val, Split::Test}) {
      const SplitData& d = data.get(s);
      const int64_t count = d.count;
      h.add(&count, sizeof count);
      hash_split(h, d);
      out.data_bytes += static_cast<int64_t>(d.images.nbytes() + d.labels.nbytes());
    }
    mine[kData] = h.value();
  }
  mine[kCheckpoint] = file_hash(env, checkpoint_path);
  out.hash_ms = ms_since(env, t0) - out.test_load_ms;

  const auto t1 = env.monotonic_now();
  std::vector<uint64_t> all(static_cast<std::size_t>(kItems * w));
  comm.allgather(mine.data(), kItems * sizeof(uint64_t), all.data());
  std::vector<int> differ[kItems];
  for (int r = 1; r < w; ++r)
    for (int i = 0; i < kItems; ++i)
      if (all[static_cast<std::size_t>(r * kItems + i)] != all[static_cast<std::size_t>(i)]) differ[i].push_back(r);
  if (std::all_of(std::begin(differ), std::end(differ), [](const std::vector<int>& v) { return v.empty(); })) {
    out.exchange_ms = ms_since(env, t1);
    return out;
  }

  // They differ (every rank sees the same hashes, so every rank takes this branch and
  // makes the same calls). For the config, the keys: rank 0's config to every rank,
  // each rank's differences back to every rank.
  std::string message = "the ranks would not train the same run, refusing to start:";
  if (!differ[kConfig].empty()) {
    uint64_t length = config_text.size();
    comm.broadcast(&length, sizeof length, 0);
    std::string rank0(static_cast<std::size_t>(length), '\0');
    if (comm.rank() == 0) rank0 = config_text;
    comm.broadcast(rank0.data(), rank0.size(), 0);
    constexpr std::size_t kNote = 480;
    std::string note = comm.rank() == 0 ? "" : config_differences(config, nlohmann::json::parse(rank0));
    if (note.size() >= kNote) note = note.substr(0, kNote - 4) + "...";
    std::vector<char> send(kNote, '\0'), notes(kNote * static_cast<std::size_t>(w));
    std::memcpy(send.data(), note.data(), note.size());
    comm.allgather(send.data(), kNote, notes.data());
    message += " the config differs from rank 0's";
    for (const int r : differ[kConfig])
      message += " on rank " + std::to_string(r) + ": " + std::string(notes.data() + r * kNote) + ";";
  }
  if (!differ[kBuild].empty()) {
    // Every rank's build in words, so that the line names both builds.
    constexpr std::size_t kWords = 240;
    std::string words = build_description();
    if (words.size() >= kWords) words = words.substr(0, kWords - 4) + "...";
    std::vector<char> send(kWords, '\0'), all_words(kWords * static_cast<std::size_t>(w));
    std::memcpy(send.data(), words.data(), words.size());
    comm.allgather(send.data(), kWords, all_words.data());
    message += " the engine build of " + rank_list(differ[kBuild]) +
               " differs from rank 0's (`engine --version` on each node): rank 0 runs " + std::string(all_words.data());
    for (const int r : differ[kBuild])
      message += ", rank " + std::to_string(r) + " runs " + std::string(all_words.data() + r * kWords);
    message += ";";
  }
  if (!differ[kData].empty())
    message += " the data of " + rank_list(differ[kData]) +
               " differs from rank 0's (data.dir holds other bytes, or data.* limits differ);";
  if (!differ[kCheckpoint].empty()) {
    const bool rank0_resumes = all[kCheckpoint] != 0;
    message += " the checkpoint " + rank_list(differ[kCheckpoint]) + " would resume from differs from rank 0's (" +
               std::string(rank0_resumes ? "rank 0 resumes from a checkpoint" : "rank 0 starts fresh") +
               "; is the run directory shared by every rank?);";
  }
  message.pop_back();
  throw StartMismatchError(message);
}

}  // namespace engine
