// `engine audit RUN_DIR [--jobs N]` (docs/replay.md): every checkpoint a run kept,
// proven by replaying to it.
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>
#include <vector>

#include "cli/commands.h"
#include "cli/exit.h"
#include "cli/replay_report.h"
#include "engine/run/recovery.h"

extern char** environ;

namespace fs = std::filesystem;

namespace engine::cli {
namespace {

struct Kept {
  std::string path;
  int64_t step = -1;
  std::string saved_on;
  std::string load_error;  // set when it does not load
};

// One replay: from `from` (a checkpoint, or "" for the run's start from `config_source`)
// to `to`, into `out`, as a child `engine replay` whose CPU threads follow `threads_file`.
struct Interval {
  std::string from;
  int64_t from_step = 0, to = 0;
  std::string out, log, threads_file;
  pid_t pid = -1;
  int status = -1;
};

pid_t start_replay(const Interval& iv, const std::string& config_source, const AuditOptions& o, int threads) {
  std::vector<std::string> args = {"/proc/self/exe", "replay", iv.from.empty() ? config_source : iv.from,
                                   "--to", std::to_string(iv.to), "-o", iv.out, "--device", o.device,
                                   "--threads-file", iv.threads_file};
  if (iv.from.empty()) args.push_back("--from-start");
  if (!o.data_dir.empty()) args.insert(args.end(), {"--data-dir", o.data_dir});
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<std::string> env_text;
  for (char** e = environ; *e; ++e)
    if (std::string(*e).rfind("OMP_NUM_THREADS=", 0) != 0) env_text.emplace_back(*e);
  env_text.push_back("OMP_NUM_THREADS=" + std::to_string(threads));
  std::vector<char*> envp;
  for (std::string& e : env_text) envp.push_back(e.data());
  envp.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, iv.log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, "/proc/self/exe", &fa, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) fail("audit: cannot start a replay: " + std::string(std::strerror(rc)));
  return pid;
}

// Written whole and renamed, so a replay never reads half a number.
void write_threads_file(const std::string& path, int threads) {
  const std::string part = path + ".part";
  std::FILE* f = std::fopen(part.c_str(), "w");
  if (!f) return;  // the replay keeps the threads it has
  std::fprintf(f, "%d\n", threads);
  std::fclose(f);
  std::rename(part.c_str(), path.c_str());
}

std::string last_line(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "r");
  if (!f) return "";
  std::string line, last;
  char buf[4096];
  while (std::fgets(buf, sizeof buf, f)) {
    line = buf;
    while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.pop_back();
    if (!line.empty()) last = line;
  }
  std::fclose(f);
  return last;
}

}  // namespace

void audit_options(CLI::App* audit, Commands& c) {
  audit->add_option("RUN_DIR", c.audit.run_dir, "the run directory")->required()->type_name("");
  audit->add_option("--jobs", c.audit.jobs, "replay this many intervals at once (default 1)")
      ->type_name("N")
      ->check(CLI::Range(1, 256).description(""));
  add_device_option(audit, c.audit.device, "where to replay (default cpu; a GPU run is audited on a GPU)");
  audit->add_option("--data-dir", c.audit.data_dir, "dataset directory (default: the stored data.dir)")
      ->type_name("DIR");
  audit->footer(
      "Each checkpoint of the run (last.h5, best.h5, epoch_NNNN.h5, best_epoch_NNNN.h5, and the same in\n"
      "every replica) is replayed from the checkpoint before it, or from the run's start, and compared\n"
      "bit for bit. One line per checkpoint: reproduced, or not reproduced with the step and tensors\n"
      "where the replay parts from the file.\n"
      "Exit status: 0 every checkpoint reproduced, 1 one is not (or an error), 2 some could not be\n"
      "compared (another device, or unreadable).");
}

int cmd_audit(const AuditOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  const ReplaySource src = open_source(o.run_dir, 1);
  const std::string device = resolve_device(o.device).str();
  // Every tier the stored config names.
  std::vector<std::string> tiers = {o.run_dir};
  const nlohmann::json cfg = nlohmann::json::parse(src.checkpoint.config_json, nullptr, false);
  if (cfg.is_object() && cfg.contains("checkpoint") && cfg["checkpoint"].contains("replicas"))
    for (const auto& r : cfg["checkpoint"]["replicas"])
      if (r.is_string() && fs::is_directory(r.get<std::string>())) tiers.push_back(r.get<std::string>());
  std::vector<Kept> kept;
  for (const std::string& tier : tiers)
    for (const CheckpointCopy& c : survey_directory(tier)) {
      Kept k{c.path, c.global_step, "", ""};
      try {
        const Checkpoint ck = load_checkpoint(c.path);
        k.step = ck.group("trainer").get_int("global_step");
        k.saved_on = ck.meta.saved_on;
      } catch (const std::exception& e) {
        k.load_error = e.what();
      }
      kept.push_back(k);
    }
  std::sort(kept.begin(), kept.end(), [](const Kept& x, const Kept& y) {
    return x.step != y.step ? x.step < y.step : x.path < y.path;
  });
  // The steps to reach, each from the checkpoint before it (one per step: the first
  // loadable one on this device), or from the run's start.
  std::set<int64_t> steps;
  std::map<int64_t, std::string> source_of;
  for (const Kept& k : kept)
    if (k.load_error.empty() && k.saved_on == device) {
      steps.insert(k.step);
      source_of.emplace(k.step, k.path);
    }
  const std::string scratch = (fs::temp_directory_path() / ("engine-audit." + std::to_string(::getpid()))).string();
  fs::create_directories(scratch);
  struct Scratch {
    std::string dir;
    ~Scratch() {
      std::error_code ec;
      fs::remove_all(dir, ec);
    }
  } cleanup{scratch};
  std::vector<Interval> intervals;
  std::string previous;
  int64_t previous_step = 0;
  for (const int64_t s : steps) {
    Interval iv;
    iv.from = previous;
    iv.from_step = previous.empty() ? 0 : previous_step;
    iv.to = s;
    iv.out = scratch + "/step_" + std::to_string(s) + ".h5";
    iv.log = scratch + "/step_" + std::to_string(s) + ".log";
    iv.threads_file = scratch + "/step_" + std::to_string(s) + ".threads";
    intervals.push_back(iv);
    previous = source_of[s];
    previous_step = s;
  }
  const int cores = std::max(1u, std::thread::hardware_concurrency());
  const int jobs = std::max(1, std::min<int>(o.jobs, static_cast<int>(intervals.size())));
  std::cout << "auditing " << kept.size() << " checkpoints of " << o.run_dir << " (" << tiers.size()
            << (tiers.size() == 1 ? " tier" : " tiers") << "): " << intervals.size() << " replays on " << device
            << ", " << jobs << (jobs == 1 ? " job" : " jobs") << " sharing " << cores
            << (cores == 1 ? " core\n" : " cores\n");
  // The longest replays start first, and the running ones share the cores: each follows
  // its threads file between steps, so the last replay takes the cores the others freed
  // instead of leaving them idle (the bits do not depend on the threads).
  std::map<const Interval*, int> threads_of;
  auto share_cores = [&](const std::map<pid_t, Interval*>& running) {
    const int n = static_cast<int>(running.size());
    int i = 0;
    for (const auto& entry : running) {
      const int threads = std::max(1, cores / n + (i++ < cores % n ? 1 : 0));
      if (threads_of[entry.second] != threads) write_threads_file(entry.second->threads_file, threads);
      threads_of[entry.second] = threads;
    }
  };
  auto run_all = [&](std::vector<Interval*> todo, int at_once) {
    std::stable_sort(todo.begin(), todo.end(),
                     [](const Interval* x, const Interval* y) { return x->to - x->from_step > y->to - y->from_step; });
    std::size_t next = 0;
    std::map<pid_t, Interval*> by_pid;
    while (next < todo.size() || !by_pid.empty()) {
      const std::size_t starting =
          std::min(todo.size() - next, static_cast<std::size_t>(at_once) - std::min<std::size_t>(at_once, by_pid.size()));
      if (starting > 0) {
        // Shared as if the new ones ran already, so none starts with more than its part.
        std::map<pid_t, Interval*> planned = by_pid;
        for (std::size_t k = 0; k < starting; ++k) planned[-1 - static_cast<pid_t>(k)] = todo[next + k];
        share_cores(planned);
        for (std::size_t k = 0; k < starting; ++k, ++next) {
          todo[next]->pid = start_replay(*todo[next], src.checkpoint_path, o, threads_of[todo[next]]);
          by_pid[todo[next]->pid] = todo[next];
        }
      }
      int status = 0;
      const pid_t done = ::waitpid(-1, &status, 0);
      if (done < 0) break;
      auto it = by_pid.find(done);
      if (it == by_pid.end()) continue;
      it->second->status = status;
      by_pid.erase(it);
      if (!by_pid.empty() && next >= todo.size()) share_cores(by_pid);
    }
  };
  std::vector<Interval*> all;
  for (Interval& iv : intervals) all.push_back(&iv);
  run_all(all, jobs);
  // Whether each file is what the replay to its step gives (a diff is made once).
  std::map<std::string, bool> same;
  auto reproduces = [&](const Kept& k, const Interval& iv) {
    if (!WIFEXITED(iv.status) || WEXITSTATUS(iv.status) != 0) return false;
    auto it = same.find(k.path);
    if (it == same.end()) it = same.emplace(k.path, diff_checkpoints(k.path, iv.out).identical).first;
    return it->second;
  };
  std::map<int64_t, Interval*> replay_of;
  for (Interval& iv : intervals) replay_of[iv.to] = &iv;
  // A replay from a file that is not reproduced proves nothing about the next one: that
  // interval is replayed again from the newest state that is (or the run's start).
  std::string proven;  // the newest reproduced file so far
  for (Interval& iv : intervals) {
    if (iv.from != proven) {
      iv.from = proven;
      same.clear();
      run_all({&iv}, 1);
    }
    for (const Kept& k : kept)
      if (k.step == iv.to && k.load_error.empty() && k.saved_on == device && reproduces(k, iv)) {
        proven = k.path;
        break;
      }
  }
  int reproduced = 0, not_reproduced = 0, not_compared = 0;
  for (const Kept& k : kept) {
    char step[32];
    std::snprintf(step, sizeof step, "step %lld", static_cast<long long>(k.step));
    if (!k.load_error.empty()) {
      std::cout << "not compared     " << k.path << ": " << k.load_error << "\n";
      ++not_compared;
      continue;
    }
    if (k.saved_on != device) {
      std::cout << "not compared     " << k.path << " (" << step << "): saved on " << k.saved_on
                << ", replayed on " << device << "; the bits of one device are not another's: audit it with --device "
                << k.saved_on << "\n";
      ++not_compared;
      continue;
    }
    const Interval& iv = *replay_of.at(k.step);
    const std::string from = iv.from.empty() ? "the run's start" : iv.from;
    if (!WIFEXITED(iv.status) || WEXITSTATUS(iv.status) != 0) {
      std::cout << "not reproduced   " << k.path << " (" << step << "): the replay from " << from
                << " failed: " << last_line(iv.log) << "\n";
      ++not_reproduced;
      continue;
    }
    if (reproduces(k, iv)) {
      std::cout << "reproduced       " << k.path << " (" << step << ", replayed from " << from << ")\n";
      ++reproduced;
      continue;
    }
    ++not_reproduced;
    const Checkpoint file = load_checkpoint(k.path), replay = load_checkpoint(iv.out);
    const StepDigest in_file = step_digest_of(file, k.path), replayed = step_digest_of(replay, iv.out);
    const bool own = stored_step_digest(file, k.path) == in_file.combined();
    std::cout << "not reproduced   " << k.path << " (" << step << ", replayed from " << from
              << "): the replay parts from the file at " << step_place(replayed) << "\n"
              << describe_difference(in_file, replayed);
    std::cout << (own ? "  its checksums and its own step digest are sound: the file holds what no replay gives "
                        "(a silent corruption before it was sealed, or a forged file)\n"
                      : "  its tensors do not give the step digest it carries: changed after the training "
                        "recorded it\n");
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  char summary[160];
  std::snprintf(summary, sizeof summary, "%d reproduced, %d not reproduced, %d not compared (%.1f s)", reproduced,
                not_reproduced, not_compared, seconds);
  std::cout << summary << "\n";
  if (not_reproduced) return 1;
  return not_compared ? 2 : 0;
}

}  // namespace engine::cli
