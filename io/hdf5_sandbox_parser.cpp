// The parser process (io/hdf5_sandbox.h): forked by the caller (io/hdf5_sandbox.cpp),
// it confines itself, then parses each file image it is sent and answers with its
// manifest, a refusal, or a failure (io/hdf5_sandbox_protocol.h).
#include <fcntl.h>
#include <signal.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cmath>
#include <cstdlib>
#include <new>
#include <string>
#include <vector>

#include <hdf5.h>

#include "io/hdf5_sandbox_protocol.h"

namespace engine::hdf5_sandbox {

namespace {

// Memory the parser may use beyond its inherited address space and twice the image:
// HDF5's metadata cache (2 MiB to start, 32 MiB at most by default), its chunk caches and
// the manifest, with room to spare (a 5 MB checkpoint needs a few MiB). A crafted file
// that makes libhdf5 allocate from a declared size meets this bound instead of the
// machine's memory.
constexpr uint64_t kParserHeadroom = uint64_t(64) << 20;

bool read_full(int fd, void* data, std::size_t n) {
  auto* p = static_cast<unsigned char*>(data);
  while (n > 0) {
    const ssize_t r = ::read(fd, p, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    n -= static_cast<std::size_t>(r);
  }
  return true;
}

bool write_full(int fd, const void* data, std::size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  while (n > 0) {
    const ssize_t r = ::send(fd, p, n, MSG_NOSIGNAL);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    n -= static_cast<std::size_t>(r);
  }
  return true;
}

uint64_t address_space_bytes() {
  char buf[128] = {};
  const int fd = ::open("/proc/self/statm", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  const ssize_t n = ::read(fd, buf, sizeof buf - 1);
  ::close(fd);
  if (n <= 0) return 0;
  return std::strtoull(buf, nullptr, 10) * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
}

void set_soft_limit(int resource, uint64_t value) {
  rlimit lim{};
  if (getrlimit(resource, &lim) != 0) return;
  lim.rlim_cur = lim.rlim_max == RLIM_INFINITY ? value : std::min<uint64_t>(value, lim.rlim_max);
  setrlimit(resource, &lim);
}

// Leaves the parser with the socket as fd 3, /dev/null as stdio, no other descriptor of
// the caller's, default signal handling except for the signals meant for the caller
// (Ctrl-C reaches the whole process group), no core dumps.
int isolate(int sock) {
  if (sock != 3) {
    if (::dup2(sock, 3) < 0) _exit(3);
    sock = 3;
  }
  const int null = ::open("/dev/null", O_RDWR);
  if (null >= 0)
    for (int fd = 0; fd < 3; ++fd) ::dup2(null, fd);
#ifdef SYS_close_range
  if (::syscall(SYS_close_range, 4u, ~0u, 0u) != 0)
#endif
    for (int fd = 4; fd < 65536; ++fd) ::close(fd);
  for (int sig = 1; sig < NSIG; ++sig)
    if (sig != SIGKILL && sig != SIGSTOP) ::signal(sig, SIG_DFL);
  for (int sig : {SIGINT, SIGQUIT, SIGTERM, SIGHUP, SIGUSR1, SIGUSR2, SIGPIPE, SIGTSTP}) ::signal(sig, SIG_IGN);
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  rlimit no_core{0, 0};
  setrlimit(RLIMIT_CORE, &no_core);
  prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
  prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
  return sock;
}

// After setup the parser needs only memory, its socket and its own limits. A seccomp
// filter makes every other system call fail with EPERM, so a parser subverted by a
// file cannot open files or sockets, start programs or signal other processes.
// Best effort: where the kernel refuses filters (qemu-user, an old kernel, a container
// that forbids them) the parser runs without one and says so in its greeting, and
// ENGINE_PARSER_SECCOMP=require makes the caller refuse to send it a file.
// Returns 0, or the errno of the refusal (ENOSYS: no filter for this architecture).
int confine() {
#if defined(__x86_64__)
  constexpr uint32_t kArch = AUDIT_ARCH_X86_64;
#elif defined(__aarch64__)
  constexpr uint32_t kArch = AUDIT_ARCH_AARCH64;
#else
  return ENOSYS;
#endif
  const int allowed[] = {
    __NR_read, __NR_write, __NR_readv, __NR_writev, __NR_recvfrom, __NR_sendto, __NR_recvmsg, __NR_sendmsg,
    __NR_close, __NR_fstat, __NR_newfstatat, __NR_lseek,
    __NR_mmap, __NR_munmap, __NR_mremap, __NR_mprotect, __NR_brk, __NR_madvise,
    __NR_futex, __NR_sched_yield, __NR_getpid, __NR_gettid, __NR_clock_gettime, __NR_gettimeofday,
    __NR_getrusage, __NR_prlimit64, __NR_getrlimit, __NR_setrlimit,
    __NR_rt_sigreturn, __NR_rt_sigprocmask, __NR_restart_syscall, __NR_ppoll,
#ifdef __NR_pause
    __NR_pause,
#endif
#ifdef __NR_poll
    __NR_poll,
#endif
    __NR_exit, __NR_exit_group,
  };
  std::vector<sock_filter> f;
  f.push_back(BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, arch)));
  f.push_back(BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, kArch, 1, 0));
  f.push_back(BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS));
  f.push_back(BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)));
  for (int nr : allowed) {
    f.push_back(BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, static_cast<uint32_t>(nr), 0, 1));
    f.push_back(BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW));
  }
  // Signals only to itself (raise(), abort() of a failed assertion in libhdf5).
  f.push_back(BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, static_cast<uint32_t>(__NR_tgkill), 0, 3));
  f.push_back(BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, args[0])));
  f.push_back(BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, static_cast<uint32_t>(::getpid()), 0, 1));
  f.push_back(BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW));
  f.push_back(BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA)));
  sock_fprog prog{static_cast<unsigned short>(f.size()), f.data()};
  return prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog, 0, 0) == 0 ? 0 : errno;
}

void reply(int sock, Status status, const std::string& body) {
  const uint64_t len = body.size() + 1;
  const auto code = static_cast<uint8_t>(status);
  if (!write_full(sock, &len, 8) || !write_full(sock, &code, 1) || !write_full(sock, body.data(), body.size()))
    _exit(0);
}

}  // namespace

[[noreturn]] void serve(int sock) {
  sock = isolate(sock);
  const uint64_t inherited = address_space_bytes();
  H5open();  // before the filter: initialising libhdf5 may read its environment's files
  const Greeting hello{kGreetingMagic, confine(), 0};
  if (!write_full(sock, &hello, sizeof hello)) _exit(0);
  for (;;) {
    Request rq{};
    if (!read_full(sock, &rq, sizeof rq)) _exit(0);  // the caller closed the socket or exited
    if (rq.magic != kRequestMagic || rq.sent > rq.image_size || rq.image_size == 0) _exit(2);
    rusage ru{};
    getrusage(RUSAGE_SELF, &ru);
    const double used = double(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) + 1e-6 * double(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
    set_soft_limit(RLIMIT_CPU, static_cast<uint64_t>(std::ceil(used + cpu_limit_seconds(rq.sent))));
    const uint64_t memory_limit = inherited + 2 * rq.image_size + kParserHeadroom;
    set_soft_limit(RLIMIT_AS, memory_limit);
    // Pages past `sent` stay untouched zeros: the parser's image costs what it is sent.
    void* image = ::mmap(nullptr, rq.image_size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (image == MAP_FAILED) {
      reply(sock, Status::Failed, "the HDF5 structure could not be parsed safely (parser out of memory)");
      _exit(0);
    }
    if (!read_full(sock, image, rq.sent)) _exit(0);
    Status status = Status::Parsed;
    std::string body;
    try {
      const auto content = rq.content == 1 ? hdf5_walk::ImageContent::Complete : hdf5_walk::ImageContent::MetadataOnly;
      body = image_parser().parse(static_cast<unsigned char*>(image), rq.image_size, content, rq.tag);
    } catch (const hdf5_walk::Refusal& e) {
      status = Status::Refused;
      body = e.what();
    } catch (const hdf5_walk::NeedsData&) {
      status = Status::NeedsData;
      body.clear();
    } catch (const std::bad_alloc&) {
      status = Status::Failed;
      body = "the HDF5 structure could not be parsed safely (parser out of memory: limit " +
             std::to_string((memory_limit - inherited) >> 20) + " MiB)";
    } catch (const std::exception& e) {
      status = Status::Failed;
      body = std::string("the HDF5 structure could not be parsed safely (") + e.what() + ")";
    }
    reply(sock, status, body);
    ::munmap(image, rq.image_size);
    // A parser that refused a file may have been left in any state by it; the next
    // parse gets a fresh process.
    if (status == Status::Refused || status == Status::Failed) _exit(0);
  }
}

}  // namespace engine::hdf5_sandbox
