// The parser process, from the caller's side: forked once (its life is in
// io/hdf5_sandbox_parser.cpp), fed file images over a socket pair, answering with
// manifests (io/hdf5_sandbox_protocol.h). Everything it says is checked by the caller
// (io/checkpoint_manifest.cpp decodes defensively; the loader checks offsets against the file).
#include "io/hdf5_sandbox.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstddef>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "io/hdf5_sandbox_protocol.h"

namespace engine::hdf5_sandbox {

namespace {

// A parser neither answering nor using CPU (blocked) is killed after this long.
constexpr double kDefaultWallSeconds = 20.0;

struct Parser {
  pid_t pid = -1;
  int sock = -1;
  pid_t owner = -1;  // the process that started it
  bool greeted = false;  // its Greeting has been read
};

// What the running parser's greeting said (under g_mutex).
int g_seccomp_errno = 0;

constexpr char kCpuLimitExceeded[] = "parser exceeded its CPU time limit";

std::mutex g_mutex;
Parser g_parser;
ImageParser* g_image_parser = nullptr;  // under g_mutex; null: the default

ImageParser& default_image_parser() {
  static ImageParser walker;
  return walker;
}

}  // namespace

// In the caller under g_mutex, and in the parser process, which inherits it.
ImageParser& image_parser() { return g_image_parser ? *g_image_parser : default_image_parser(); }

namespace {

// The pending parse between start() and finish().
struct Pending {
  const unsigned char* image = nullptr;
  uint64_t sent = 0, image_size = 0;
  uint32_t content = 0, tag = 0;
  std::chrono::steady_clock::time_point deadline;
  double wall_seconds = 0;
  long long cpu_ticks = -1;  // the parser's CPU time at the last deadline (-1: not sampled)
  int extensions = 0;
  bool reused = false;  // sent to a parser that had parsed before
  bool died = false;    // the parser's end of the socket closed (crash or kill)
  bool failed = false;
  std::string failure;
};
Pending g_pending;

std::string signal_name(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  return "signal " + std::to_string(sig) + (abbrev ? std::string(" (SIG") + abbrev + ")" : "");
}

// Ends the parser: waits briefly for a process that is exiting by itself, then kills it.
// Returns how it ended, for messages.
std::string retire(bool kill_now) {
  Parser p = g_parser;
  g_parser = Parser{};
  if (p.sock >= 0) ::close(p.sock);
  if (p.pid < 0) return "";
  int status = 0;
  pid_t r = 0;
  if (!kill_now) {
    for (int i = 0; i < 200 && (r = ::waitpid(p.pid, &status, WNOHANG)) == 0; ++i) ::usleep(500);
  }
  if (r == 0 || kill_now) {
    ::kill(p.pid, SIGKILL);
    while ((r = ::waitpid(p.pid, &status, 0)) < 0 && errno == EINTR) {
    }
  }
  if (r != p.pid) return "parser ended, status unknown";
  if (WIFSIGNALED(status)) {
    if (WTERMSIG(status) == SIGXCPU) return kCpuLimitExceeded;
    return "parser crashed: " + signal_name(WTERMSIG(status));
  }
  if (WIFEXITED(status)) return "parser exited with status " + std::to_string(WEXITSTATUS(status));
  return "parser ended";
}

// atexit: the process that forked the parser ends it. Skipped when another thread holds
// the lock (exit while a parse is under way): the parser then ends on the closed socket.
void retire_at_exit() {
  if (!g_mutex.try_lock()) return;
  if (g_parser.pid >= 0 && g_parser.owner == ::getpid()) retire(/*kill_now=*/true);
  g_mutex.unlock();
}

bool spawn(std::string& why) {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
    why = std::string("cannot create the parser's socket: ") + std::strerror(errno);
    return false;
  }
  const pid_t pid = ::fork();
  if (pid < 0) {
    why = std::string("cannot start the parser process: ") + std::strerror(errno);
    ::close(sv[0]);
    ::close(sv[1]);
    return false;
  }
  if (pid == 0) {
    ::close(sv[0]);
    serve(sv[1]);
  }
  ::close(sv[1]);
  ::fcntl(sv[0], F_SETFL, ::fcntl(sv[0], F_GETFL) | O_NONBLOCK);
  g_parser = Parser{pid, sv[0], ::getpid()};
  // At exit the parser is ended and reaped, rather than left to notice the closed socket
  // after the program is gone: nothing the engine started outlives it (a supervisor that
  // watches the process group, a test, a scheduler's accounting sees it end with it).
  static const bool registered = std::atexit(retire_at_exit) == 0;
  (void)registered;
  return true;
}

enum class Io { Done, Closed, TimedOut };

// CPU time the parser has used, in clock ticks (-1 if unknown).
long long parser_cpu_ticks() {
  char buf[1024] = {};
  const int fd = ::open(("/proc/" + std::to_string(g_parser.pid) + "/stat").c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  const ssize_t n = ::read(fd, buf, sizeof buf - 1);
  ::close(fd);
  const char* p = n > 0 ? std::strrchr(buf, ')') : nullptr;
  if (!p) return -1;
  // After the command name: state, then fields 4..13, then utime (14) and stime (15).
  long long utime = 0, stime = 0;
  if (std::sscanf(p + 1, " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lld %lld", &utime, &stime) != 2) return -1;
  return utime + stime;
}

// At the wall-clock deadline: a parser still using CPU is making progress on a busy
// machine and has its CPU limit to stop it, so it gets more time (up to ten times);
// one that is blocked does not.
// The first time, the parser's CPU time is sampled and a second's probe granted.
bool extend_deadline() {
  const long long ticks = parser_cpu_ticks();
  if (ticks < 0) return false;
  double more = g_pending.wall_seconds;
  if (g_pending.cpu_ticks < 0) {
    more = 1.0;
  } else if (ticks <= g_pending.cpu_ticks || ++g_pending.extensions > 10) {
    return false;
  }
  g_pending.cpu_ticks = ticks;
  g_pending.deadline = std::chrono::steady_clock::now() +
                       std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(more));
  return true;
}

Io wait_for(int fd, short events) {
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(g_pending.deadline -
                                                                            std::chrono::steady_clock::now());
    if (left.count() <= 0 && !extend_deadline()) return Io::TimedOut;
    if (left.count() <= 0) continue;
    pollfd p{fd, events, 0};
    const int r = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count() + 1, 1 << 30)));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return Io::Closed;
    if (r > 0) return (p.revents & events) ? Io::Done : Io::Closed;
  }
}

Io send_all(const void* data, std::size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  while (n > 0) {
    const ssize_t r = ::send(g_parser.sock, p, n, MSG_NOSIGNAL);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      const Io w = wait_for(g_parser.sock, POLLOUT);
      if (w != Io::Done) return w;
      continue;
    }
    if (r <= 0) return Io::Closed;
    p += r;
    n -= static_cast<std::size_t>(r);
  }
  return Io::Done;
}

Io recv_all(void* data, std::size_t n) {
  auto* p = static_cast<unsigned char*>(data);
  while (n > 0) {
    const ssize_t r = ::recv(g_parser.sock, p, n, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      const Io w = wait_for(g_parser.sock, POLLIN);
      if (w != Io::Done) return w;
      continue;
    }
    if (r <= 0) return Io::Closed;
    p += r;
    n -= static_cast<std::size_t>(r);
  }
  return Io::Done;
}

std::string unsafe(const std::string& why) { return "the HDF5 structure could not be parsed safely (" + why + ")"; }

// A failed exchange: retire the parser and say what happened to it.
void fail_pending(Io io) {
  std::string how = retire(io == Io::TimedOut);
  if (io == Io::TimedOut) {
    char secs[32];
    std::snprintf(secs, sizeof secs, "%g", g_pending.wall_seconds);
    how = std::string("parser killed after ") + secs + " s without an answer";
  }
  g_pending.failed = true;
  // A parser stopped by its CPU limit was not killed from outside: no second try.
  g_pending.died = io == Io::Closed && how != kCpuLimitExceeded;
  g_pending.failure = unsafe(how.empty() ? "parser ended" : how);
}

// A line from the parser: attacker-influenced text (names from the file), so control
// characters are replaced and the length bounded before it reaches a message.
std::string one_line(const std::string& s) {
  std::string out = s.substr(0, 2000);
  for (char& c : out)
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = '?';
  return out;
}

// ENGINE_PARSER_SECCOMP: "require" refuses to send a file to a parser without its
// filter; "best-effort" (the default, also when unset) parses without it.
enum class SeccompPolicy { BestEffort, Require, Invalid };
SeccompPolicy seccomp_policy() {
  const char* v = std::getenv("ENGINE_PARSER_SECCOMP");
  if (!v || !*v || std::strcmp(v, "best-effort") == 0) return SeccompPolicy::BestEffort;
  if (std::strcmp(v, "require") == 0) return SeccompPolicy::Require;
  return SeccompPolicy::Invalid;
}

// Reads the greeting of a parser that has not sent it yet (within g_pending's deadline).
Io read_greeting() {
  if (g_parser.greeted) return Io::Done;
  Greeting hello{};
  const Io io = recv_all(&hello, sizeof hello);
  if (io != Io::Done) return io;
  if (hello.magic != kGreetingMagic) return Io::Closed;
  g_parser.greeted = true;
  g_seccomp_errno = hello.seccomp_errno;
  return Io::Done;
}

// Why this parser may not be sent a file ("" when it may).
std::string policy_refusal() {
  switch (seccomp_policy()) {
    case SeccompPolicy::BestEffort:
      return "";
    case SeccompPolicy::Invalid:
      return std::string("ENGINE_PARSER_SECCOMP='") + one_line(std::getenv("ENGINE_PARSER_SECCOMP")) +
             "' is not 'require' or 'best-effort'";
    case SeccompPolicy::Require:
      if (g_seccomp_errno == 0) return "";
      return "not parsed: the parser's seccomp filter could not be installed (" +
             std::string(std::strerror(g_seccomp_errno)) + ") and ENGINE_PARSER_SECCOMP=require forbids parsing without it";
  }
  return "";
}

// Sends the pending request, to a new parser if none runs or the last one has gone.
void send_request() {
  g_pending.failed = g_pending.died = false;
  g_pending.cpu_ticks = -1;
  g_pending.extensions = 0;
  if (g_parser.pid >= 0 && g_parser.owner != ::getpid()) {
    // This is a fork of the process that started the parser: the parser is not ours
    // to talk to, wait for or kill. Let go of the inherited socket and start our own.
    ::close(g_parser.sock);
    g_parser = Parser{};
  }
  g_pending.deadline = std::chrono::steady_clock::now() +
                       std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                           std::chrono::duration<double>(g_pending.wall_seconds));
  // A parser started ahead (prepare()) has a greeting waiting: it is read first, so that
  // the socket's readability below means what it says.
  if (g_parser.pid >= 0 && !g_parser.greeted && read_greeting() != Io::Done) retire(true);
  if (g_parser.pid >= 0) {
    // Nothing is due from an idle parser: a readable or hung-up socket means it is gone.
    pollfd p{g_parser.sock, POLLIN, 0};
    if (::poll(&p, 1, 0) != 0) retire(true);
  }
  g_pending.reused = g_parser.pid >= 0;
  if (g_parser.pid < 0) {
    std::string why;
    if (!spawn(why)) {
      g_pending.failed = true;
      g_pending.failure = unsafe(why);
      return;
    }
  }
  // The untrusted bytes go only to a parser that has said how it is confined.
  Io io = read_greeting();
  if (io != Io::Done) {
    fail_pending(io);
    return;
  }
  const std::string refusal = policy_refusal();
  if (!refusal.empty()) {
    retire(true);
    g_pending.failed = true;
    g_pending.failure = refusal;
    return;
  }
  const Request rq{kRequestMagic, g_pending.image_size, g_pending.sent, g_pending.content, g_pending.tag};
  io = send_all(&rq, sizeof rq);
  if (io == Io::Done) io = send_all(g_pending.image, g_pending.sent);
  if (io != Io::Done) fail_pending(io);
}

// The reply to the pending request.
Reply receive_reply() {
  Reply out;
  out.outcome = Outcome::Failed;
  if (g_pending.failed) {
    out.message = g_pending.failure;
    return out;
  }
  uint64_t len = 0;
  Io io = recv_all(&len, 8);
  // A reply holds at most the image's data once (chunked and compact datasets read
  // through HDF5) plus names and scalars, which are part of the image too.
  const uint64_t cap = 2 * g_pending.sent + 2 * (uint64_t(1) << 20);
  if (io == Io::Done && (len == 0 || len > cap)) {
    retire(true);
    out.message = unsafe("parser sent a malformed reply");
    return out;
  }
  std::vector<unsigned char> body;
  if (io == Io::Done) {
    try {
      body.resize(static_cast<std::size_t>(len));
    } catch (const std::bad_alloc&) {
      retire(true);
      out.message = unsafe("parser sent a malformed reply");
      return out;
    }
    io = recv_all(body.data(), body.size());
  }
  if (io != Io::Done) {
    fail_pending(io);
    out.message = g_pending.failure;
    return out;
  }
  switch (body[0]) {
    case static_cast<uint8_t>(Status::Parsed): {
      std::string why;
      if (manifest::decode(body.data() + 1, body.size() - 1, out.manifest, why)) {
        out.outcome = Outcome::Parsed;
        return out;
      }
      retire(true);
      out.manifest = manifest::Manifest{};
      out.message = unsafe("parser sent a malformed reply: " + why);
      return out;
    }
    case static_cast<uint8_t>(Status::NeedsData):
      out.outcome = Outcome::NeedsData;
      return out;
    case static_cast<uint8_t>(Status::Refused):
      out.outcome = Outcome::Refused;
      retire(false);  // it exits by itself after refusing
      out.message = one_line(std::string(body.begin() + 1, body.end()));
      if (out.message.empty()) out.message = unsafe("parser refused without a reason");
      return out;
    case static_cast<uint8_t>(Status::Failed):
      retire(false);
      out.message = one_line(std::string(body.begin() + 1, body.end()));
      if (out.message.rfind("the HDF5 structure could not be parsed safely", 0) != 0) out.message = unsafe("parser failed");
      return out;
    default:
      retire(true);
      out.message = unsafe("parser sent a malformed reply");
      return out;
  }
}


}  // namespace

void start(const unsigned char* image, std::size_t sent, std::size_t image_size, ImageContent content) {
  g_mutex.lock();
  g_pending = Pending{};
  g_pending.image = image;
  g_pending.sent = sent;
  g_pending.image_size = image_size;
  g_pending.content = content == ImageContent::Complete ? 1u : 0u;
  g_pending.tag = image_parser().next_request_tag();
  g_pending.wall_seconds = image_parser().wall_limit_seconds(kDefaultWallSeconds + 4 * cpu_limit_seconds(sent));
  try {
    send_request();
  } catch (...) {  // only allocation failures; finish() reports them
    g_pending.failed = true;
    g_pending.failure = unsafe("out of memory while starting the parse");
  }
}

Reply finish() {
  std::lock_guard<std::mutex> unlock_at_end(g_mutex, std::adopt_lock);
  Reply reply = receive_reply();
  // A parser that had served earlier loads and dies on this one may have been killed
  // from outside (the OOM killer, a signal) rather than by this file: one new parser
  // gets the same request. A file that crashes the parser crashes the new one too.
  if (reply.outcome == Outcome::Failed && g_pending.died && g_pending.reused) {
    send_request();
    reply = receive_reply();
  }
  return reply;
}

void prepare() {
  std::lock_guard<std::mutex> lock(g_mutex);
  std::string ignored;
  if (g_parser.pid < 0 || g_parser.owner != ::getpid()) {
    if (g_parser.pid >= 0) ::close(g_parser.sock);
    g_parser = Parser{};
    spawn(ignored);
  }
}

Confinement confinement() {
  std::lock_guard<std::mutex> lock(g_mutex);
  Confinement out;
  out.policy_error = seccomp_policy() == SeccompPolicy::Invalid ? policy_refusal() : "";
  out.required = seccomp_policy() == SeccompPolicy::Require;
  if (g_parser.pid >= 0 && g_parser.owner != ::getpid()) {
    ::close(g_parser.sock);
    g_parser = Parser{};
  }
  std::string why;
  if (g_parser.pid < 0 && !spawn(why)) {
    out.start_error = why;
    return out;
  }
  g_pending = Pending{};
  g_pending.wall_seconds = kDefaultWallSeconds;
  g_pending.deadline = std::chrono::steady_clock::now() +
                       std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                           std::chrono::duration<double>(g_pending.wall_seconds));
  const Io io = read_greeting();
  if (io != Io::Done) {
    out.start_error = retire(true);
    if (out.start_error.empty()) out.start_error = "the parser ended before it was ready";
    return out;
  }
  out.known = true;
  out.seccomp_errno = g_seccomp_errno;
  return out;
}

Reply parse(const unsigned char* image, std::size_t sent, std::size_t image_size, ImageContent content) {
  start(image, sent, image_size, content);
  return finish();
}

std::string ImageParser::parse(unsigned char* image, std::size_t image_size, ImageContent content,
                               uint32_t) const {
  return manifest::encode(hdf5_walk::walk(image, image_size, content));
}

void use_parser(ImageParser* parser) {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_image_parser = parser ? parser : &default_image_parser();
  // The running parser process was forked with the parser it had; the next parse forks
  // one with this one.
  if (g_parser.pid >= 0 && g_parser.owner == ::getpid()) retire(/*kill_now=*/true);
}

int parser_pid() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_parser.pid;
}

}  // namespace engine::hdf5_sandbox
