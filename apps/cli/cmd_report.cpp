// `engine report RUN_DIR`.
#include <iostream>

#include "cli/commands.h"
#include "engine/train/model_factory.h"
#include "report/report.h"

namespace engine::cli {

void report_options(CLI::App* report, Commands& c) {
  report->add_option("RUN_DIR", c.report.run_dir, "the run directory")->required()->type_name("");
  report->add_option("-o,--output", c.report.output, "where to write (default RUN_DIR/report.html)")
      ->type_name("FILE");
  add_device_option(report, c.report.device, "where to evaluate best.h5 (default auto)");
  report->add_option("--data-dir", c.report.data_dir, "dataset directory (default: best.h5's data.dir)")
      ->type_name("DIR");
}

int cmd_report(const ReportCliOptions& a) {
  ReportOptions opt;
  opt.make_model = [](const Config& c) { return make_model(c); };
  opt.output = a.output;
  if (!a.device.empty()) opt.device = a.device;
  opt.data_dir = a.data_dir;
  const ReportSummary r = write_run_report(a.run_dir, opt);
  for (const std::string& n : r.notes) std::cerr << "engine: note: " << n << "\n";
  std::cout << "report of " << r.epochs << " epoch(s) written to " << r.path << "\n";
  return 0;
}

}  // namespace engine::cli
