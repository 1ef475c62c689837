// The `engine` command line (apps/engine_cli.h): a thin layer over the library
// (engine/train/trainer.h, engine/io/checkpoint.h, engine/train/inference.h). Arguments are parsed by CLI11, one
// subcommand at a time: a command takes only its own options and refuses any other with
// a one-line usage error (exit 2). Every other error is one line on stderr, exit 1.
// This file is the table of commands; each command is apps/cli/cmd_<command>.cpp.
#include <malloc.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>
#include <stdexcept>
#include <string>

#include "cli/commands.h"
#include "cli/console_observer.h"
#include "cli/exit.h"
#include "cli/help.h"
#include "engine/core/build_info.h"
#include "engine/io/checkpoint.h"
#include "engine_cli.h"

namespace engine::cli {
namespace {

const char* kMainHelp = R"(engine: trains Fashion-MNIST classifiers (model.name: fashion_cnn, mlp) and never loses a run.

usage: engine <command> [options]

commands:
  train CONFIG.json      train from a config; resumes from the newest sound checkpoint of the run
  resume CKPT.h5         continue the run recorded in a checkpoint (its config is inside), or RUN_DIR
  eval CKPT.h5           test loss, accuracy and confusion matrix of a checkpoint
  inspect CKPT.h5        human summary of a checkpoint
  verify CKPT.h5         integrity and structure check (exit 0 only when sound)
  diff A.h5 B.h5         compare two checkpoints tensor by tensor (exit 0 when identical)
  bisect A B             the first step where two runs part, and what differs there (docs/replay.md)
  replay CKPT --to STEP  train again from a checkpoint (or a run's start) to a step; write it
  audit RUN_DIR          prove every checkpoint of a run by replaying to it (exit 0 when all are)
  report RUN_DIR         one self-contained HTML page: curves, confusion matrix, config, checkpoints
  export CKPT.h5         the model as ONNX or safetensors, with metadata and a self-test (docs/export.md)
  verify-export FILE     runs an export's self-test through the engine (exit 0 only when it passes)
  version                the engine's version, its libraries' and the GPU's (also --version)
  keys                   every config key: type, default, valid values, meaning (docs/config.md)

Run `engine <command> --help` for the options of a command.
)";

void no_options(CLI::App*, Commands&) {}

// Whether a command forks the checkpoint parser (io/hdf5_sandbox.h) before it runs:
// while the process is still small, since it will load checkpoints.
enum class ParsesCheckpoints { No, Yes };

struct Command {
  const char* name;
  const char* summary;  // the first line of its --help
  ParsesCheckpoints parser;
  void (*options)(CLI::App*, Commands&);
  int (*run)(const Commands&);
};

// What the program does: one row per command, in the order of engine --help.
const Command kCommands[] = {
    {"train", "Trains the model described by CONFIG.json (see docs/config.md).", ParsesCheckpoints::Yes,
     train_options, [](const Commands& c) { return cmd_train(c.train); }},
    {"resume", "Continues the run recorded in a checkpoint.", ParsesCheckpoints::Yes, resume_options,
     [](const Commands& c) { return cmd_resume(c.resume); }},
    {"eval", "Evaluates the model of a checkpoint on the test set: loss, accuracy, confusion matrix.",
     ParsesCheckpoints::Yes, eval_options, [](const Commands& c) { return cmd_eval(c.eval); }},
    {"inspect",
     "Human summary of a checkpoint: version, saved_on, counters, every tensor with dtype, shape and norm.",
     ParsesCheckpoints::No, inspect_options, [](const Commands& c) { return cmd_inspect(c.inspect_path); }},
    {"verify", "Integrity and structure check of a checkpoint: checksum and structure.", ParsesCheckpoints::No,
     verify_options, [](const Commands& c) { return cmd_verify(c.verify_path); }},
    {"diff", "Compares two checkpoints tensor by tensor, scalar by scalar.", ParsesCheckpoints::No, diff_options,
     [](const Commands& c) { return cmd_diff(c.diff_a, c.diff_b); }},
    {"bisect",
     "Finds the first global step where two runs (run directories or checkpoints) part, from their "
     "step digests, or by replaying both from the newest state they share; names what differs there, "
     "and between their configs and builds.",
     ParsesCheckpoints::Yes, bisect_options, [](const Commands& c) { return cmd_bisect(c.bisect); }},
    {"replay",
     "Trains again from a checkpoint, or from the start of a run, to exactly global step STEP and writes "
     "a full checkpoint there; --check compares every step with a run's recorded step digests.",
     ParsesCheckpoints::Yes, replay_options, [](const Commands& c) { return cmd_replay(c.replay); }},
    {"audit",
     "Proves each checkpoint a run kept (last, best, milestones, best_epoch files, replicas) by "
     "replaying to it from its predecessor or the run's start and comparing bit for bit.",
     ParsesCheckpoints::Yes, audit_options, [](const Commands& c) { return cmd_audit(c.audit); }},
    {"report",
     "Writes one self-contained HTML file (no network, no scripts) of a run: loss, accuracy, "
     "learning-rate and loss-scale curves per epoch (from RUN_DIR/metrics.jsonl, else the "
     "metrics of RUN_DIR/last.h5), the confusion matrix of best.h5 on the test set, the "
     "run's config, and the checkpoints present with their epoch, size and integrity.",
     ParsesCheckpoints::No, report_options, [](const Commands& c) { return cmd_report(c.report); }},
    {"export",
     "Writes the model of a checkpoint as an ONNX inference graph or a safetensors file of PyTorch's "
     "state_dict, with its metadata and self-test probes (docs/export.md).",
     ParsesCheckpoints::Yes, export_options, [](const Commands& c) { return cmd_export(c.export_); }},
    {"verify-export",
     "Runs an export's self-test: rebuilds the model from the file, runs its probe inputs through the "
     "engine's CPU kernels and checks the logits against the recorded ones within their tolerances.",
     ParsesCheckpoints::No, verify_export_options,
     [](const Commands& c) { return cmd_verify_export(c.verify_export_path); }},
    {"version", "The engine's version, its libraries' and the GPU's.", ParsesCheckpoints::No, no_options,
     [](const Commands&) { return cmd_version(); }},
    {"keys",
     "Every config key as docs/config.md's tables give it (markdown): key, type, default, valid values, "
     "meaning; the tables are generated from the engine's key table.",
     ParsesCheckpoints::No, no_options, [](const Commands&) { return cmd_keys(); }},
};

const Command* find_command(const std::string& name) {
  for (const Command& c : kCommands)
    if (name == c.name) return &c;
  return nullptr;
}

void build_commands(CLI::App& app, Commands& c) {
  app.formatter(make_formatter());
  app.require_subcommand(1);
  app.set_help_flag("-h,--help", "print this help and exit");  // copied by each command
  for (const Command& cmd : kCommands) {
    CLI::App* sub = app.add_subcommand(cmd.name, cmd.summary);
    cmd.options(sub, c);
    sub->formatter(make_formatter());
  }
  app.set_help_flag();  // after the subcommands, which copy it; main prints kMainHelp itself
}

// The subcommand being parsed when CLI11 threw (for the message), or null at the top.
const CLI::App* deepest_parsed(const CLI::App& app) {
  for (const CLI::App* sub : app.get_subcommands()) return sub;
  return nullptr;
}

}  // namespace

int run(int argc, char** argv, TrainerObserver* also) {
  set_host_observer(also);
  // Tensor buffers of 1 MiB and more get their own mappings and go back to the OS when
  // freed (glibc would otherwise raise this threshold and keep them in the heap).
  mallopt(M_MMAP_THRESHOLD, 1 << 20);
  // Line by line even into a file or a pipe: a process that ends at once (a second
  // Ctrl-C, _exit) must not lose the lines it printed (the header, the epochs).
  std::setvbuf(stdout, nullptr, _IOLBF, BUFSIZ);
  if (argc < 2) {
    std::cerr << kMainHelp;
    return kExitUsage;
  }
  const std::string first = argv[1];
  if (first == "-h" || first == "--help" || first == "help") {
    std::cout << kMainHelp;
    return 0;
  }
  // ENGINE_CPU_KERNELS forcing a path this CPU lacks: refused before anything runs (an
  // illegal instruction later would be a crash, not an error).
  try {
    (void)cpu_kernels_in_use();
  } catch (const std::runtime_error& e) {
    fail(e.what(), kExitUsage);
  }
  if (first == "--version") {
    std::cout << version_text();
    return 0;
  }

  if (!find_command(first)) fail("unknown command '" + first + "' (see engine --help)", kExitUsage);
  CLI::App app{"", "engine"};
  Commands c;
  build_commands(app, c);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    const CLI::App* sub = deepest_parsed(app);
    std::cout << (sub ? sub->help("engine") : std::string(kMainHelp));
    return 0;
  } catch (const CLI::ParseError& e) {
    const CLI::App* sub = deepest_parsed(app);
    const std::string cmd = sub ? sub->get_name() : first;
    fail(cmd + ": " + e.what() + " (see engine " + cmd + " --help)", kExitUsage);
  }

  const Command& cmd = *find_command(deepest_parsed(app)->get_name());
  try {
    if (cmd.parser == ParsesCheckpoints::Yes) start_checkpoint_parser();
    return cmd.run(c);
  } catch (const std::exception& e) {
    fail(e.what());
  }
}

}  // namespace engine::cli
