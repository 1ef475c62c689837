// `engine eval CKPT.h5`.
#include <climits>
#include <fstream>
#include <iomanip>
#include <iostream>

#include "cli/commands.h"
#include "cli/console_observer.h"
#include "cli/exit.h"
#include "engine/io/checkpoint.h"
#include "engine/io/dataset.h"
#include "engine/train/inference.h"
#include "engine/train/model_factory.h"

namespace engine::cli {

void eval_options(CLI::App* eval, Commands& c) {
  eval->add_option("CKPT.h5", c.eval.checkpoint, "the checkpoint to evaluate")->required()->type_name("");
  add_device_option(eval, c.eval.device, "where to evaluate (default auto)");
  eval->add_option("--data-dir", c.eval.data_dir, "dataset directory (default: the checkpoint's data.dir)")
      ->type_name("DIR");
  eval->add_option("--dump-logits", c.eval.dump_logits,
                   "write the test logits as float32 little-endian [N, classes]")
      ->type_name("FILE");
  eval->add_option("--limit", c.eval.limit, "evaluate only the first N test images (N >= 1)")
      ->type_name("N")
      ->check(CLI::Range(int64_t{1}, int64_t{INT64_MAX}).description(""));
  eval->footer("Exit status: 0 evaluated, 1 error, 2 usage.");
}

int cmd_eval(const EvalOptions& a) {
  const std::string& path = a.checkpoint;
  const Device device = resolve_device(a.device);
  const Classifier clf(path, device, make_model);
  DataConfig data = clf.config().data;
  if (!a.data_dir.empty()) data.dir = a.data_dir;
  if (a.limit) data.test_limit = *a.limit;
  const std::unique_ptr<Dataset> dataset = make_dataset(data, Device::cpu());
  const SplitData& test = dataset->get(Split::Test);
  const Predictions p = clf.predict(test.images.u8(), test.count, Scores::Logits);
  const EvalResult t = score_logits(p, test.labels.u8());
  // The counters for the header line (the classifier keeps only the model).
  const Checkpoint ckpt = load_checkpoint(path);
  std::cout << "checkpoint " << path << " (epoch " << ckpt.groups.at("trainer").get_int("epoch")
            << ", saved on " << ckpt.meta.saved_on << "), evaluated on " << device.str() << "\n";
  print_test(t);
  std::cout << "confusion matrix (rows: true class, columns: predicted):\n";
  for (const std::vector<int64_t>& row : t.confusion) {
    for (const int64_t count : row) std::cout << std::setw(6) << count;
    std::cout << "\n";
  }
  if (!a.dump_logits.empty()) {
    std::ofstream out(a.dump_logits, std::ios::binary);
    out.write(reinterpret_cast<const char*>(p.scores.data()),
              static_cast<std::streamsize>(p.scores.size() * sizeof(float)));
    if (!out) fail(a.dump_logits + ": cannot write logits");
    std::cout << "logits [" << p.count << ", " << p.classes << "] written to " << a.dump_logits << "\n";
  }
  return 0;
}

}  // namespace engine::cli
