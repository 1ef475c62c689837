#include "engine/io/config_sections.h"

#include "io/config_keys.h"

namespace engine {

const ConfigSection<DataConfig>& data_config_keys() {
  using S = DataConfig;
  static const ConfigSection<S> keys = {
      nonempty_string_key("dir", &S::dir, "non-empty",
          R"doc(Directory with `train-images-idx3-ubyte`, `train-labels-idx1-ubyte`, `t10k-images-idx3-ubyte` and `t10k-labels-idx1-ubyte`, each plain or gzipped (`.gz`). If it is missing, install it with `apt-get install dataset-fashion-mnist` (as root, or through sudo).)doc"),
      integer_key("batch_size", &S::batch_size, 1, 65536, "1 … 65536",
          R"doc(Images per training step. Evaluation uses the same batch size.)doc"),
      integer_key("val_split", &S::val_split, 0, INT_MAX, "≥ 0, and less than the number of training images",
          R"doc(The last `val_split` images of the training file are held out for validation. This is a fixed split, whatever the seed. With `0` there is no validation set, so the monitored metric carries no information; also set `train.early_stopping.patience` to `0`.)doc"),
      nullable_integer_key("train_limit", &S::train_limit, 1, "≥ 1",
          R"doc(Train on the first N images that remain after the validation split is taken off. `null` uses all of them. Useful for quick runs.)doc"),
      nullable_integer_key("test_limit", &S::test_limit, 1, "≥ 1",
          R"doc(Evaluate on the first N test images. `null` uses all of them.)doc"),
      any_real_key("mean", &S::mean, "finite",
          R"doc(Pixels are scaled to [0, 1], then normalised as `(x − mean) / std`. The defaults are the Fashion-MNIST training-set statistics.)doc"),
      real_key("std", &S::std, [](double v) { return v > 0; }, "must be > 0", "> 0",
          R"doc(See `data.mean`.)doc"),
  };
  return keys;
}

}  // namespace engine
