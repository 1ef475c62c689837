// The config section the io layer reads: data (docs/config.md), for make_dataset
// (engine/io/dataset.h). How sections make up the config: engine/io/config_table.h.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include "engine/io/config_table.h"

namespace engine {

struct DataConfig {
  std::string dir = "/usr/share/datasets/fashion-mnist";
  int batch_size = 128;
  int val_split = 5000;                    // images held out of the training set
  std::optional<int64_t> train_limit;      // null = all (after the validation split)
  std::optional<int64_t> test_limit;       // null = all
  double mean = 0.2860;
  double std = 0.3530;
};

const ConfigSection<DataConfig>& data_config_keys();

}  // namespace engine
