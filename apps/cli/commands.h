// The commands of `engine` (apps/engine_cli.cpp holds their table): each command's
// options, the function that declares them to CLI11, and the function that runs it and
// returns its exit status. One file each: cmd_<command>.cpp.
#pragma once
#include <CLI/CLI.hpp>
#include <cstdint>
#include <optional>
#include <string>

#include "cli/run_options.h"

namespace engine::cli {

struct TrainOptions {
  std::string config_path;
  bool fresh = false;
  RunOptions run;
};

struct ResumeOptions {
  std::string checkpoint;
  bool non_strict = false;
  RunOptions run;
};

struct EvalOptions {
  std::string checkpoint, device = "auto", data_dir, dump_logits;
  std::optional<int64_t> limit;
};

struct ReportCliOptions {
  std::string run_dir, output, device, data_dir;
};

struct ExportOptionsCli {
  std::string checkpoint, format, output, data_dir;
};

struct ReplayCliOptions {
  std::string source, output, check_dir, device = "cpu", data_dir;
  std::string threads_file;  // audit's children: the CPU threads to use, read between steps
  int64_t to = -1;
  bool from_start = false;
};

struct BisectOptions {
  std::string a, b, device = "cpu", data_dir;
};

struct AuditOptions {
  std::string run_dir, device = "cpu", data_dir;
  int jobs = 1;
};

// Every command's options: CLI11 fills the one of the command given.
struct Commands {
  ExportOptionsCli export_;
  std::string verify_export_path;
  TrainOptions train;
  ResumeOptions resume;
  EvalOptions eval;
  ReportCliOptions report;
  std::string inspect_path, verify_path;
  std::string diff_a, diff_b;
  ReplayCliOptions replay;
  BisectOptions bisect;
  AuditOptions audit;
};

void train_options(CLI::App* train, Commands& c);
int cmd_train(const TrainOptions& a);

void resume_options(CLI::App* resume, Commands& c);
int cmd_resume(const ResumeOptions& a);

void eval_options(CLI::App* eval, Commands& c);
int cmd_eval(const EvalOptions& a);

void inspect_options(CLI::App* inspect, Commands& c);
int cmd_inspect(const std::string& path);

void verify_options(CLI::App* verify, Commands& c);
int cmd_verify(const std::string& path);

void diff_options(CLI::App* diff, Commands& c);
int cmd_diff(const std::string& a, const std::string& b);

// docs/replay.md.
void replay_options(CLI::App* replay, Commands& c);
int cmd_replay(const ReplayCliOptions& a);
void bisect_options(CLI::App* bisect, Commands& c);
int cmd_bisect(const BisectOptions& a);
void audit_options(CLI::App* audit, Commands& c);
int cmd_audit(const AuditOptions& a);

void report_options(CLI::App* report, Commands& c);
int cmd_report(const ReportCliOptions& a);

void export_options(CLI::App* c, Commands& cmds);
int cmd_export(const ExportOptionsCli& a);

void verify_export_options(CLI::App* c, Commands& cmds);
int cmd_verify_export(const std::string& path);

// `engine version` and `engine --version`: the build's components, then the collectives
// it can run ranks with.
std::string version_text();
int cmd_version();

// docs/config.md's key tables, one per top-level section, in the table's order.
int cmd_keys();

}  // namespace engine::cli
