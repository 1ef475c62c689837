// Test-only (engine_testing, never in libengine.a): a parser for the checkpoint sandbox
// (io/hdf5_sandbox.h) that misbehaves on request, to test that the loader survives a
// parser that crashes, spins, blocks, runs out of memory or replies nonsense.
#pragma once

namespace engine::hdf5_sandbox::testing {

// Crash: SIGSEGV; Spin: a busy loop (stopped by the CPU limit); Stall: a blocked wait
// (stopped by the wall-clock watchdog); Garbage: a malformed reply; Allocate: allocates
// until the memory limit.
enum class Fault { None, Crash, Spin, Stall, Garbage, Allocate };

// Makes the parser misbehave on the next parse (installing the fault-injecting parser
// on first use, which replaces a running parser process).
void inject_next(Fault fault);
// Wall-clock watchdog in seconds for the next parses (0 restores the default).
void set_wall_limit(double seconds);
// The parser's process id, or -1 when none runs.
int parser_pid();

}  // namespace engine::hdf5_sandbox::testing
