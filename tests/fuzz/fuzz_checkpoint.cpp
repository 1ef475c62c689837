// libFuzzer harness: the checkpoint loader, from the bytes of a file.
// The input is a whole checkpoint file. The custom mutator mutates the HDF5 payload
// (mostly its metadata region, where the structure lives) and then reseals the header
// checksums, so that nearly every input gets past the CRCs into the structural checks
// and the HDF5 parser: a CRC stops accidents, not an adversary.
// Expected outcome for every input: success, or a CheckpointError whose message is one
// line starting with the path. Anything else (a crash, a sanitizer report, another
// exception, a multi-line message) is a finding.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <vector>

#include "engine/io/checkpoint.h"
#include "fuzz_util.h"

extern "C" size_t LLVMFuzzerMutate(uint8_t* data, size_t size, size_t max_size);

namespace {

// FUZZ_VERBOSE=1: print each outcome (to see what a replayed input does).
bool verbose() {
  static const bool on = std::getenv("FUZZ_VERBOSE") != nullptr;
  return on;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static fuzz::MemFile file;
  const std::string& path = file.write(data, size);
  bool verified = false;
  try {
    engine::verify_checkpoint_file(path);
    verified = true;
  } catch (const engine::CheckpointError& e) {
    fuzz::require_one_line(e.what(), path);
    if (verbose()) std::cerr << "refused: " << e.what() << "\n";
  }
  if (verbose() && verified) std::cerr << "accepted\n";
  if (!verified) return 0;
  // verify promises everything load checks: a verified file must load.
  try {
    engine::Checkpoint c = engine::load_checkpoint(path);
    (void)engine::inspect_checkpoint(path);
  } catch (const engine::CheckpointError& e) {
    std::cerr << "verify accepted the file but load/inspect refused it: " << e.what() << "\n";
    std::abort();
  }
  return 0;
}

// Mutates a checkpoint's payload and reseals the header; anything that is not a
// checkpoint is mutated as plain bytes.
extern "C" size_t LLVMFuzzerCustomMutator(uint8_t* data, size_t size, size_t max_size, unsigned int seed) {
  if (!fuzz::looks_like_checkpoint(data, size)) return LLVMFuzzerMutate(data, size, max_size);
  std::srand(seed);
  const size_t payload = size - fuzz::kUserBlock;
  long long meta = fuzz::header_value(data, size, "metadata_bytes", static_cast<long long>(payload));
  if (meta <= 0 || static_cast<size_t>(meta) > payload) meta = static_cast<long long>(payload);
  const int choice = std::rand() % 16;
  if (choice < 12 && meta > 0) {
    // A window of the metadata, mutated in place (addresses elsewhere stay valid).
    const size_t window = 1 + static_cast<size_t>(std::rand()) % 64;
    const size_t len = window < static_cast<size_t>(meta) ? window : static_cast<size_t>(meta);
    const size_t at = fuzz::kUserBlock + static_cast<size_t>(std::rand()) % (static_cast<size_t>(meta) - len + 1);
    std::vector<uint8_t> w(data + at, data + at + len);
    const size_t got = LLVMFuzzerMutate(w.data(), w.size(), w.size());
    std::memcpy(data + at, w.data(), got < len ? got : len);
  } else if (choice < 15) {
    // The whole payload, which may change its length (and the metadata boundary).
    const size_t got = LLVMFuzzerMutate(data + fuzz::kUserBlock, payload, max_size - fuzz::kUserBlock);
    size = fuzz::kUserBlock + got;
    if (choice == 14) meta = static_cast<long long>(std::rand()) % (static_cast<long long>(got) + 1);
  } else {
    // The header itself, left unsealed: the header checks get their share too.
    return LLVMFuzzerMutate(data, size, max_size);
  }
  fuzz::reseal(data, size, meta);
  return size;
}
