#include "io/deferred_remove.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <set>
#include <system_error>
#include <thread>

namespace engine {

namespace {

// One worker thread and its queue, owned by the process that started the thread. The
// object is never destroyed: an atexit handler drains the queue instead, so that a
// normal exit leaves nothing behind, and a child made by fork() (which has no worker
// thread, and maybe a copy of a locked mutex) neither waits for the parent's removals
// nor touches the copied queue: it removes its own files at once.
class Remover {
 public:
  static Remover& instance() {
    static Remover* remover = new Remover;  // never destroyed (see above)
    return *remover;
  }

  void add(Env& env, std::string path) {
    if (!in_owner()) {
      env.remove(path);
      return;
    }
    std::unique_lock<std::mutex> lock(mutex_);
    if (!started_) {
      try {
        std::thread([this] { run(); }).detach();
      } catch (const std::system_error&) {
        lock.unlock();
        env.remove(path);  // no thread to be had: remove it now
        return;
      }
      started_ = true;
      std::atexit([] { Remover::instance().drain(); });
    }
    queue_.push_back({&env, std::move(path)});
    wake_.notify_one();
  }

  // Waits for the removals queued through `env` (null: all of them).
  void drain(const Env* env = nullptr) {
    if (!in_owner()) return;
    std::unique_lock<std::mutex> lock(mutex_);
    idle_.wait(lock, [&] {
      if (env == nullptr) return queue_.empty() && busy_ == nullptr;
      if (busy_ == env) return false;
      for (const Removal& r : queue_)
        if (r.env == env) return false;
      return true;
    });
  }

 private:
  Remover() : owner_(getpid()) {}

  bool in_owner() const { return getpid() == owner_; }

  struct Removal {
    Env* env;
    std::string path;
  };

  void run() {
    std::unique_lock<std::mutex> lock(mutex_);
    while (true) {
      wake_.wait(lock, [this] { return !queue_.empty(); });
      const Removal r = std::move(queue_.front());
      queue_.pop_front();
      busy_ = r.env;
      lock.unlock();
      r.env->remove(r.path);
      lock.lock();
      busy_ = nullptr;
      idle_.notify_all();  // a drain for this Env may be waiting, whatever is left
    }
  }

  const pid_t owner_;
  std::mutex mutex_;
  std::condition_variable wake_, idle_;
  std::deque<Removal> queue_;
  const Env* busy_ = nullptr;  // the Env of the removal under way
  bool started_ = false;
};

constexpr std::chrono::seconds kTemporaryAge{3600};

bool all_digits(const std::string& s) {
  return !s.empty() && s.find_first_not_of("0123456789") == std::string::npos;
}

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// The pid a leftover name was made by, or -1 if `name` is not one of ours:
// ".<x>.h5.old.<pid>.<n>" or ".<x>.h5.tmp.<pid>" (then `temporary` is set), and the
// same for ".<x>.jsonl" (metrics.jsonl is replaced the same way).
long leftover_pid(const std::string& name, bool& temporary) {
  if (name.size() < 2 || name[0] != '.') return -1;
  std::size_t at = name.rfind(".tmp.");
  std::string pid_text;
  temporary = at != std::string::npos && all_digits(name.substr(at + 5));
  if (temporary) {
    pid_text = name.substr(at + 5);
  } else {
    at = name.rfind(".old.");
    if (at == std::string::npos) return -1;
    const std::string rest = name.substr(at + 5);
    const std::size_t dot = rest.find('.');
    if (dot == std::string::npos || !all_digits(rest.substr(0, dot)) || !all_digits(rest.substr(dot + 1))) return -1;
    pid_text = rest.substr(0, dot);
  }
  const std::string base = name.substr(0, at);
  if (!(ends_with(base, ".h5") || ends_with(base, ".jsonl")) || pid_text.size() > 9) return -1;
  return std::stol(pid_text);
}

}  // namespace

void remove_later(Env& env, std::string path) { Remover::instance().add(env, std::move(path)); }

void finish_pending_removals() { Remover::instance().drain(); }

void finish_pending_removals(const Env& env) { Remover::instance().drain(&env); }

std::string replaced_version_name(const std::string& dir_prefix, const std::string& name) {
  static std::atomic<unsigned long> counter{0};
  return dir_prefix + "." + name + ".old." + std::to_string(getpid()) + "." + std::to_string(counter++);
}

void sweep_leftovers_once(Env& env, const std::string& dir) {
  static std::mutex mutex;
  static std::set<std::string> swept;
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (!swept.insert(dir).second) return;
  }
  std::vector<std::string> names;
  if (env.list_dir(dir, names) != 0) return;
  const long self = static_cast<long>(getpid());
  const auto now = std::chrono::floor<std::chrono::seconds>(env.wall_now());  // as time(2)
  for (const std::string& name : names) {
    bool temporary = false;
    const long pid = leftover_pid(name, temporary);
    if (pid <= 0 || pid == self) continue;
    // A live process (or one we may not signal) may still be using its files.
    if (::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;
    // A pid is only known dead on this machine. Removing another machine's hidden old
    // version (shared directory) only frees it sooner, but its temporary file may be a
    // save in progress: those go only once they are an hour old.
    const std::string path = dir + "/" + name;
    FileInfo info;
    if (temporary && (env.stat(path, info) != 0 || now - info.modified < kTemporaryAge)) continue;
    remove_later(env, path);
  }
}

int sweep_dead_writers(Env& env, const std::string& dir, const std::vector<std::string>& also) {
  int removed = 0;
  const long self = static_cast<long>(getpid());
  std::vector<std::string> names;
  if (env.list_dir(dir, names) == 0) {
    for (const std::string& name : names) {
      bool temporary = false;
      const long pid = leftover_pid(name, temporary);
      if (pid <= 0 || pid == self) continue;
      if (env.remove(dir + "/" + name) == 0) ++removed;
    }
  }
  for (const std::string& f : also)
    if (env.remove(dir + "/" + f) == 0) ++removed;
  return removed;
}

}  // namespace engine
