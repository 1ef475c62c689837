// Test-only: `test_reaper SECONDS COMMAND ARGS...` runs one CTest test so that nothing
// it starts outlives it. It becomes the child subreaper of everything below it
// (PR_SET_CHILD_SUBREAPER), so a process the test leaves behind -- a forked child a
// failing test case never killed, an mpirun, a daemon -- is re-parented to it instead
// of to init. When the command exits, whatever is left is killed (after a short grace,
// and named on stderr); when the command runs past SECONDS, the command and everything
// under it are killed and the test fails (exit 124). Without it, a left-over process
// holding CTest's output pipe keeps ctest waiting for ever, even after its TIMEOUT has
// killed the test itself. Every test in tests/ runs under it (engine_add_test, checked by
// the test `every_test_bounded`); CTest's own TIMEOUT, a little longer, is the backstop.
// The command's exit status is passed through (128 + N when a signal N ended it).
#include <dirent.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

// The processes whose parent is us: after their parents die, everything the test
// started ends up here.
std::vector<pid_t> children_of(pid_t parent) {
  std::vector<pid_t> found;
  DIR* proc = ::opendir("/proc");
  if (!proc) return found;
  while (dirent* e = ::readdir(proc)) {
    char* end = nullptr;
    const long pid = std::strtol(e->d_name, &end, 10);
    if (*end || pid <= 0) continue;
    std::ifstream stat("/proc/" + std::string(e->d_name) + "/stat");
    std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
    // pid (comm) state ppid ...: comm may hold spaces and parentheses; the last ')' ends it.
    const auto close = text.rfind(')');
    if (close == std::string::npos) continue;
    char state = 0;
    long ppid = 0;
    if (std::sscanf(text.c_str() + close + 1, " %c %ld", &state, &ppid) == 2 && ppid == parent)
      found.push_back(static_cast<pid_t>(pid));
  }
  ::closedir(proc);
  return found;
}

std::string command_of(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/cmdline");
  std::string cmd((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  for (char& c : cmd)
    if (c == '\0') c = ' ';
  if (cmd.size() > 120) cmd = cmd.substr(0, 117) + "...";
  return cmd;
}

void reap_zombies() {
  while (::waitpid(-1, nullptr, WNOHANG) > 0) {}
}

// SIGKILLs every process below us until none is left (a process re-parented to us while
// we kill is found in the next round). Returns how many were killed.
int kill_everything_below(bool name_them) {
  int killed = 0;
  for (int round = 0; round < 1000; ++round) {
    reap_zombies();
    std::vector<pid_t> left = children_of(::getpid());
    if (left.empty()) break;
    for (pid_t p : left) {
      if (name_them) std::fprintf(stderr, "test_reaper: killing left-over pid %d: %s\n", p, command_of(p).c_str());
      if (::kill(p, SIGKILL) == 0) ++killed;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  reap_zombies();
  return killed;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: test_reaper SECONDS COMMAND [ARGS...]\n");
    return 2;
  }
  const double limit = std::atof(argv[1]);
  if (!(limit > 0)) {
    std::fprintf(stderr, "test_reaper: '%s' is not a number of seconds\n", argv[1]);
    return 2;
  }
  if (::prctl(PR_SET_CHILD_SUBREAPER, 1) != 0) std::perror("test_reaper: PR_SET_CHILD_SUBREAPER");
  const pid_t test = ::fork();
  if (test < 0) {
    std::perror("test_reaper: fork");
    return 2;
  }
  if (test == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // should the reaper itself be killed
    ::execvp(argv[2], argv + 2);
    std::fprintf(stderr, "test_reaper: cannot run %s: %s\n", argv[2], std::strerror(errno));
    ::_exit(127);
  }
  // CTest's own signals (ctest interrupted) end the test and what it started too.
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) ::signal(sig, SIG_IGN);
  const auto t0 = Clock::now();
  int status = 0;
  bool timed_out = false;
  for (;;) {
    const pid_t got = ::waitpid(-1, &status, WNOHANG);
    if (got == test) break;
    if (got > 0) continue;  // an orphan of the test that has ended: reaped
    if (std::chrono::duration<double>(Clock::now() - t0).count() > limit) {
      timed_out = true;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (timed_out) {
    std::fprintf(stderr, "test_reaper: %s ran past %.0f s: killing it and every process it started\n", argv[2],
                 limit);
    ::kill(test, SIGKILL);
    ::waitpid(test, &status, 0);
    kill_everything_below(true);
    return 124;
  }
  // What the test left behind gets a moment to end by itself (an mpirun's ranks, a
  // parser process going down with its parent), then is killed and named.
  const auto grace_end = Clock::now() + std::chrono::seconds(2);
  while (!children_of(::getpid()).empty() && Clock::now() < grace_end) {
    reap_zombies();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (const int n = kill_everything_below(true))
    std::fprintf(stderr, "test_reaper: the test left %d process(es) running; killed\n", n);
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) {
    std::fprintf(stderr, "test_reaper: %s was killed by signal %d (%s)\n", argv[2], WTERMSIG(status),
                 strsignal(WTERMSIG(status)));
    return 128 + WTERMSIG(status);
  }
  return 1;
}
