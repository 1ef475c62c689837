// `engine verify CKPT.h5`.
#include <iostream>

#include "cli/commands.h"
#include "engine/io/checkpoint.h"

namespace engine::cli {

void verify_options(CLI::App* verify, Commands& c) {
  verify->add_option("CKPT.h5", c.verify_path, "the checkpoint")->required()->type_name("");
  verify->footer("Exit status: 0 only when the file is sound.");
}

int cmd_verify(const std::string& path) {
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
