// A process a test starts, that cannot outlive the test case: the destructor SIGKILLs
// and reaps it unless it was waited for, and PR_SET_PDEATHSIG kills it should the test
// process itself die first (a crash, CTest's timeout). Everything else a test leaves
// behind is caught by tests/tools/test_reaper.cpp at the end of the test process.
#pragma once
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <functional>
#include <string>

namespace test_util {

class ChildProcess {
 public:
  // How the child's stdout and stderr go.
  enum class Output { Inherit, Pipe };

  ChildProcess() = default;
  // Runs `body` in a forked child (which must not return: _exit), killed with the test.
  static ChildProcess fork_running(const std::function<void()>& body, Output out = Output::Inherit) {
    ChildProcess c;
    int fds[2] = {-1, -1};
    if (out == Output::Pipe && ::pipe2(fds, O_CLOEXEC) != 0) return c;
    const pid_t parent = ::getpid();
    c.pid_ = ::fork();
    if (c.pid_ < 0) return c;
    if (c.pid_ == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(137);  // the test died before prctl
      if (out == Output::Pipe) {
        ::dup2(fds[1], STDOUT_FILENO);
        ::dup2(fds[1], STDERR_FILENO);
      }
      try {
        body();
      } catch (...) {  // never back into the test framework in the child
        ::_exit(126);
      }
      ::_exit(127);
    }
    if (out == Output::Pipe) {
      ::close(fds[1]);
      c.out_ = ::fdopen(fds[0], "r");
    }
    return c;
  }
  // `/bin/sh -c command`: with `exec` in front, the child becomes the program itself.
  static ChildProcess shell(const std::string& command, Output out = Output::Pipe) {
    return fork_running([&] { ::execl("/bin/sh", "sh", "-c", command.c_str(), static_cast<char*>(nullptr)); }, out);
  }

  ChildProcess(ChildProcess&& o) noexcept { *this = std::move(o); }
  ChildProcess& operator=(ChildProcess&& o) noexcept {
    if (this != &o) {
      kill_and_reap();
      pid_ = o.pid_, out_ = o.out_, status_ = o.status_;
      o.pid_ = -1, o.out_ = nullptr;
    }
    return *this;
  }
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;
  ~ChildProcess() { kill_and_reap(); }

  pid_t pid() const { return pid_; }
  FILE* output() const { return out_; }  // Output::Pipe only
  bool running() {
    if (pid_ <= 0) return false;
    if (::waitpid(pid_, &status_, WNOHANG) == pid_) pid_ = -pid_;  // reaped: remember it
    return pid_ > 0;
  }
  // Waits for the exit and returns the wait status.
  int wait() {
    if (pid_ > 0) ::waitpid(pid_, &status_, 0), pid_ = -pid_;
    close_output();
    return status_;
  }
  void kill_and_reap() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, &status_, 0);
      pid_ = -pid_;
    }
    close_output();
  }

 private:
  void close_output() {
    if (out_) std::fclose(out_);
    out_ = nullptr;
  }
  pid_t pid_ = -1;  // negative once reaped
  FILE* out_ = nullptr;
  int status_ = 0;
};

}  // namespace test_util
