// `engine verify CKPT.h5`.
#include <iostream>

#include "cli/commands.h"
#include "engine/io/checkpoint.h"
#include "engine/io/memory_tier.h"
#include "cli/exit.h"

namespace engine::cli {

void verify_options(CLI::App* verify, Commands& c) {
  verify->add_option("CKPT.h5", c.verify_path, "the checkpoint, or a memory tier's slot file")->required()->type_name("");
  verify->footer("Exit status: 0 only when the file is sound.");
}

int cmd_verify(const std::string& path) {
  // A memory tier's slot file: sound when its newest sealed slot is (what a resume takes).
  if (memory_tier::is_slot_file(path)) {
    const memory_tier::Contents c = memory_tier::read(path, "", memory_tier::Read::States);
    if (!c.problem.empty()) fail(path + ": " + c.problem);
    std::string others;
    for (const memory_tier::Slot& s : c.slots)
      if (!s.problem.empty() && s.problem != "never written")
        others += "; slot " + std::to_string(s.index) + ": " + s.problem;
    const memory_tier::Slot* n = c.newest();
    if (!n) fail(path + ": no sound slot" + others);
    for (const memory_tier::Slot& s : c.slots)
      if (s.sealed && s.sequence > n->sequence)
        fail(path + ": the newest slot (" + std::to_string(s.index) + ", global step " + std::to_string(s.global_step) +
             ") is not sound: " + s.problem);
    std::cout << path << ": OK (slot " << n->index << ", global step " << n->global_step << others << ")\n";
    return 0;
  }
  verify_checkpoint_file(path);
  std::cout << path << ": OK\n";
  // A sound verdict from a parser that ran unconfined is still sound, but the user
  // is told the file was parsed with less protection than docs/security.md describes.
  const CheckpointParserConfinement parser = checkpoint_parser_confinement();
  if (!parser.seccomp_filter)
    std::cerr << "engine: warning: " << path << " was parsed without the parser's seccomp filter ("
              << parser.reason << "); ENGINE_PARSER_SECCOMP=require refuses instead (docs/security.md)\n";
  return 0;
}

}  // namespace engine::cli
