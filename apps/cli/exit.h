// How the `engine` commands end: the exit statuses docs/cli.md lists, and fail(), the
// one-line error every command ends with.
#pragma once
#include <string>

namespace engine::cli {

constexpr int kExitUsage = 2;
// Exit status of train/resume when the disk refused a save (docs/cli.md).
constexpr int kExitSaveFailed = 3;
// Exit statuses of a training run that stopped before its end.
constexpr int kExitInterrupted = 130;  // Ctrl-C / SIGTERM, last.h5 saved
constexpr int kExitTimeLimit = 75;     // --time-limit reached, last.h5 saved (EX_TEMPFAIL)

// "engine: MSG" on stderr, and the process (under mpirun/srun, every rank) exits with
// `code`. Under several ranks every error and warning names its rank ("engine: rank 2:
// ..."), and an error on one rank ends every rank (RunSession::abort_job, through the
// job a session joined, which outlives the session), instead of leaving the others in a
// collective.
[[noreturn]] void fail(const std::string& msg, int code = 1);

}  // namespace engine::cli
