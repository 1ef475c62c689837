// Repairs after a survey of the run's tiers (engine/run/run_directory.h): each tier whose
// lock this process holds gets the checkpoints it lacks, or holds damaged or stale,
// rewritten from the reference copy, or from a state another rank sent.
#include <cerrno>
#include <cstring>

#include "engine/run/run_files.h"
#include "io/atomic_file.h"
#include "io/read_file.h"
#include "run/run_directory_impl.h"

namespace engine {

namespace fs = std::filesystem;
using namespace run_directory_internal;

std::vector<std::string> RunDirectory::repair_from(const std::string& bytes, int64_t global_step,
                                                  const std::string& source, const RunSurvey& survey) {
  Impl& m = *impl_;
  m.wait_until([&m] { return m.all_written(); });
  std::vector<std::string> lines;
  std::vector<std::string> writable{m.dir};
  for (const Impl::Replica& r : m.replicas)
    if (r.lock) writable.push_back(r.dir);
  for (const std::string& tier : writable) {
    const CheckpointCopy* here = nullptr;
    for (const CheckpointCopy& c : survey.copies)
      if (c.dir == tier && c.file == run_files::kLast) here = &c;
    std::string why;
    if (!here) why = "missing";
    else if (here->verdict == CopyVerdict::Damaged) why = "damaged: " + here->reason;
    else if (here->verdict == CopyVerdict::OtherRun) continue;
    else if (here->global_step < global_step)
      why = "stale: global step " + std::to_string(here->global_step) + ", " + source + " has " +
            std::to_string(global_step);
    else continue;
    const std::string target = (fs::path(tier) / run_files::kLast).string();
    try {
      if (m.env.make_dirs(tier) != 0) throw_filesystem_error("cannot create directories", tier, errno);
      write_file_atomically(m.env, target, bytes);
      lines.push_back("repaired " + target + " (" + why + ") from " + source);
    } catch (const std::exception& e) {
      lines.push_back(std::string("warning: cannot repair ") + target + " (" + why + "): " + e.what());
    }
  }
  return lines;
}

std::vector<std::string> RunDirectory::repair(const RunSurvey& survey) {
  Impl& m = *impl_;
  m.wait_until([&m] { return m.all_written(); });  // nothing in flight writes a tier meanwhile
  std::vector<std::string> lines;
  const CheckpointCopy* used = survey.chosen_copy();
  if (!used) return lines;
  // The tiers this process holds the lock of: only those are written.
  std::vector<std::string> writable{m.dir};
  for (const Impl::Replica& r : m.replicas)
    if (r.lock) writable.push_back(r.dir);
  // Each file name's reference: last.h5's is the copy resumed from; another name's, its
  // newest sound copy in any tier.
  std::map<std::string, const CheckpointCopy*> reference;
  reference[run_files::kLast] = used;
  for (const CheckpointCopy& c : survey.copies) {
    if (c.verdict != CopyVerdict::Sound || c.file == run_files::kLast) continue;
    const CheckpointCopy*& r = reference[c.file];
    if (!r || c.global_step > r->global_step) r = &c;
  }
  for (const auto& [file, ref] : reference) {
    for (const std::string& tier : writable) {
      const CheckpointCopy* here = nullptr;
      for (const CheckpointCopy& c : survey.copies)
        if (c.dir == tier && c.file == file) here = &c;
      std::string why;
      if (!here) why = "missing";
      else if (here->verdict == CopyVerdict::Damaged) why = "damaged: " + here->reason;
      else if (here->verdict == CopyVerdict::OtherRun) continue;  // another run's: this run's next save replaces it
      else if (here->global_step < ref->global_step)
        why = "stale: global step " + std::to_string(here->global_step) + ", " + ref->path + " has " +
              std::to_string(ref->global_step);
      else continue;
      if (here == ref) continue;
      const std::string target = (fs::path(tier) / file).string();
      std::string bytes;
      if (read_whole_file(m.env, ref->path, bytes) != 0) {
        const int err = errno;
        lines.push_back("warning: cannot repair " + target + " (" + why + "): cannot read " + ref->path + ": " +
                        std::strerror(err));
        continue;
      }
      try {
        if (m.env.make_dirs(tier) != 0) throw_filesystem_error("cannot create directories", tier, errno);
        write_file_atomically(m.env, target, bytes);
        lines.push_back("repaired " + target + " (" + why + ") from " + ref->path);
      } catch (const std::exception& e) {
        lines.push_back(std::string("warning: cannot repair ") + target + " (" + why + "): " + e.what());
      }
    }
  }
  return lines;
}

}  // namespace engine
