#include "io/deferred_remove.h"

#include <dirent.h>
#include <sys/stat.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <ctime>
#include <cerrno>
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

  void add(std::string path) {
    if (!in_owner()) {
      ::unlink(path.c_str());
      return;
    }
    std::unique_lock<std::mutex> lock(mutex_);
    if (!started_) {
      try {
        std::thread([this] { run(); }).detach();
      } catch (const std::system_error&) {
        lock.unlock();
        ::unlink(path.c_str());  // no thread to be had: remove it now
        return;
      }
      started_ = true;
      std::atexit([] { Remover::instance().drain(); });
    }
    queue_.push_back(std::move(path));
    wake_.notify_one();
  }

  void drain() {
    if (!in_owner()) return;
    std::unique_lock<std::mutex> lock(mutex_);
    idle_.wait(lock, [this] { return queue_.empty() && !busy_; });
  }

 private:
  Remover() : owner_(getpid()) {}

  bool in_owner() const { return getpid() == owner_; }

  void run() {
    std::unique_lock<std::mutex> lock(mutex_);
    while (true) {
      wake_.wait(lock, [this] { return !queue_.empty(); });
      const std::string path = std::move(queue_.front());
      queue_.pop_front();
      busy_ = true;
      lock.unlock();
      ::unlink(path.c_str());
      lock.lock();
      busy_ = false;
      if (queue_.empty()) idle_.notify_all();
    }
  }

  const pid_t owner_;
  std::mutex mutex_;
  std::condition_variable wake_, idle_;
  std::deque<std::string> queue_;
  bool busy_ = false, started_ = false;
};

constexpr std::time_t kTemporaryAgeSeconds = 3600;

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

void remove_later(std::string path) { Remover::instance().add(std::move(path)); }

void finish_pending_removals() { Remover::instance().drain(); }

std::string replaced_version_name(const std::string& dir_prefix, const std::string& name) {
  static std::atomic<unsigned long> counter{0};
  return dir_prefix + "." + name + ".old." + std::to_string(getpid()) + "." + std::to_string(counter++);
}

void sweep_leftovers_once(const std::string& dir) {
  static std::mutex mutex;
  static std::set<std::string> swept;
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (!swept.insert(dir).second) return;
  }
  DIR* d = ::opendir(dir.c_str());
  if (!d) return;
  const long self = static_cast<long>(getpid());
  const std::time_t now = std::time(nullptr);
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    bool temporary = false;
    const long pid = leftover_pid(name, temporary);
    if (pid <= 0 || pid == self) continue;
    // A live process (or one we may not signal) may still be using its files.
    if (::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;
    // A pid is only known dead on this machine. Removing another machine's hidden old
    // version (shared directory) only frees it sooner, but its temporary file may be a
    // save in progress: those go only once they are an hour old.
    const std::string path = dir + "/" + name;
    struct stat st {};
    if (temporary && (::stat(path.c_str(), &st) != 0 || now - st.st_mtime < kTemporaryAgeSeconds)) continue;
    remove_later(path);
  }
  ::closedir(d);
}

int sweep_dead_writers(const std::string& dir, const std::vector<std::string>& also) {
  int removed = 0;
  const long self = static_cast<long>(getpid());
  if (DIR* d = ::opendir(dir.c_str())) {
    while (const dirent* e = ::readdir(d)) {
      const std::string name = e->d_name;
      bool temporary = false;
      const long pid = leftover_pid(name, temporary);
      if (pid <= 0 || pid == self) continue;
      if (::unlink((dir + "/" + name).c_str()) == 0) ++removed;
    }
    ::closedir(d);
  }
  for (const std::string& f : also)
    if (::unlink((dir + "/" + f).c_str()) == 0) ++removed;
  return removed;
}

}  // namespace engine
