#include "kernels/cpu/cpu_features.h"

#include <omp.h>

#include <cstdlib>
#include <stdexcept>
#include <string>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

namespace engine::kernels::cpu {

namespace {

struct Features {
  bool avx2_fma = false;  // AVX2 and FMA, with the OS saving the YMM state
  bool avx512f = false;   // AVX-512F, with the OS saving the ZMM and opmask state
  bool fma = false;       // FMA in hardware (x86 FMA3 or any aarch64)
};

#if defined(__x86_64__) || defined(__i386__)
unsigned long long xgetbv0() {
  unsigned eax = 0, edx = 0;
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return (static_cast<unsigned long long>(edx) << 32) | eax;
}

Features detect() {
  Features f;
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
  const bool has_fma = c & (1u << 12), osxsave = c & (1u << 27), has_avx = c & (1u << 28);
  f.fma = has_fma;
  if (!osxsave || !has_avx) return f;
  const unsigned long long xcr0 = xgetbv0();
  const bool ymm_saved = (xcr0 & 0x6) == 0x6;            // SSE and AVX state
  const bool zmm_saved = (xcr0 & 0xe6) == 0xe6;          // and opmask, ZMM_Hi256, Hi16_ZMM
  if (__get_cpuid_max(0, nullptr) < 7) return f;
  __cpuid_count(7, 0, a, b, c, d);
  const bool has_avx2 = b & (1u << 5), has_avx512f = b & (1u << 16);
  f.avx2_fma = ymm_saved && has_avx2 && has_fma;
  f.avx512f = zmm_saved && has_avx512f && f.avx2_fma;
  return f;
}
#else
Features detect() {
  Features f;
#if defined(__aarch64__)
  f.fma = true;  // fmadd is part of the base architecture
#endif
  return f;
}
#endif

const Features& features() {
  static const Features f = detect();
  return f;
}

struct Choice {
  CpuKernels path = CpuKernels::Portable;
  bool forced = false;
  std::string error;  // set: ENGINE_CPU_KERNELS cannot be honoured
};

std::string supported_list() {
  std::string s;
  for (CpuKernels k : {CpuKernels::Avx512, CpuKernels::Avx2, CpuKernels::Portable})
    if (cpu_supports(k)) s += std::string(s.empty() ? "" : ", ") + cpu_kernels_name(k);
  return s;
}

Choice choose() {
  Choice c;
  const char* forced = std::getenv("ENGINE_CPU_KERNELS");
  if (forced && *forced) {
    const std::string want = forced;
    c.forced = true;
    if (want == "avx512") c.path = CpuKernels::Avx512;
    else if (want == "avx2") c.path = CpuKernels::Avx2;
    else if (want == "portable") c.path = CpuKernels::Portable;
    else {
      c.error = "ENGINE_CPU_KERNELS=" + want + ": not a path (avx512, avx2 or portable)";
      return c;
    }
    if (!cpu_supports(c.path))
      c.error = "ENGINE_CPU_KERNELS=" + want + ": this CPU cannot run it (it runs: " + supported_list() + ")";
    return c;
  }
  c.path = cpu_supports(CpuKernels::Avx512) ? CpuKernels::Avx512
           : cpu_supports(CpuKernels::Avx2) ? CpuKernels::Avx2
                                             : CpuKernels::Portable;
  return c;
}

const Choice& choice() {
  static const Choice c = choose();
  return c;
}

}  // namespace

const char* cpu_kernels_name(CpuKernels k) {
  switch (k) {
    case CpuKernels::Avx512: return "avx512";
    case CpuKernels::Avx2: return "avx2";
    case CpuKernels::Portable: return "portable";
  }
  return "?";
}

bool cpu_supports(CpuKernels k) {
  switch (k) {
    case CpuKernels::Avx512: return features().avx512f;
    case CpuKernels::Avx2: return features().avx2_fma;
    case CpuKernels::Portable: return true;
  }
  return false;
}

bool cpu_has_hardware_fma() { return features().fma; }

CpuKernels cpu_kernels() {
  const Choice& c = choice();
  if (!c.error.empty()) throw CpuKernelsError(c.error);
  return c.path;
}

std::string cpu_kernels_description() {
  const CpuKernels path = cpu_kernels();
  const int threads = omp_get_max_threads();
  std::string s = std::string(cpu_kernels_name(path)) + " (" + std::to_string(threads) +
                  (threads == 1 ? " thread" : " threads") + (choice().forced ? ", ENGINE_CPU_KERNELS" : "") + ")";
  if (path == CpuKernels::Portable && !cpu_has_hardware_fma())
    s += "; no hardware FMA: software fma, the same bits, many times slower";
  return s;
}

int cpu_threads() { return omp_get_max_threads(); }

void set_cpu_threads(int threads) { omp_set_num_threads(threads < 1 ? 1 : threads); }

}  // namespace engine::kernels::cpu
