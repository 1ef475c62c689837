// `engine export CKPT.h5`.
#include <chrono>
#include <iomanip>
#include <iostream>
#include <sstream>

#include "cli/commands.h"
#include "engine/train/export.h"

namespace engine::cli {
namespace {

std::string with_thousands(int64_t v) {
  std::string digits = std::to_string(v), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

}  // namespace

void export_options(CLI::App* c, Commands& cmds) {
  ExportOptionsCli& o = cmds.export_;
  c->add_option("CKPT.h5", o.checkpoint, "the checkpoint to export (any model, saved on any device)")
      ->required()
      ->type_name("");
  c->add_option("--format", o.format, "onnx: an inference graph (opset 13); safetensors: PyTorch's state_dict")
      ->required()
      ->type_name("onnx|safetensors")
      ->check(CLI::IsMember({"onnx", "safetensors"}));
  c->add_option("-o,--output", o.output, "the file to write (atomically)")->required()->type_name("FILE");
  c->add_option("--data-dir", o.data_dir, "dataset directory for the recorded test accuracy (default: the "
                                          "checkpoint's data.dir)")
      ->type_name("DIR");
  c->footer("The file carries the engine version, the source checkpoint's path and CRC-32, epoch, global "
            "step, the config's CRC-32, the test accuracy, the input normalisation, and probes: fixed inputs "
            "with the engine's logits and per-logit tolerances (engine verify-export checks them). Exit "
            "status: 0 written, 1 error, 2 usage.");
}

int cmd_export(const ExportOptionsCli& a) {
  const auto start = std::chrono::steady_clock::now();
  ExportOptions options;
  options.data_dir = a.data_dir;
  const ExportSummary s = export_checkpoint(a.checkpoint, parse_export_format(a.format), a.output, options);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::ostringstream o;
  o << std::fixed << std::setprecision(2) << "exported " << s.model << " (" << with_thousands(s.parameters)
    << " parameters) of " << a.checkpoint << " (epoch " << s.metadata.at("epoch") << ", step "
    << s.metadata.at("global_step") << ") to " << s.path << ": " << to_string(s.format)
    << (s.format == ExportFormat::Onnx ? " opset " + std::to_string(kExportOnnxOpset) : std::string()) << ", "
    << with_thousands(static_cast<int64_t>(s.bytes)) << " bytes, test accuracy " << 100 * s.test_accuracy << " % on "
    << s.test_count << " images, " << kExportProbes << " probes (tolerance <= " << std::setprecision(3)
    << std::scientific << s.max_tolerance << "), " << std::fixed << std::setprecision(2) << seconds << " s\n";
  std::cout << o.str();
  return 0;
}

}  // namespace engine::cli
