#include <doctest/doctest.h>

#include <zlib.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <unistd.h>

#include "engine/io/idx.h"
#include "scratch_dir.h"

using engine::DataError;
namespace fs = std::filesystem;

namespace {

const char* const kRealDataset = "/usr/share/datasets/fashion-mnist";

using Bytes = std::vector<uint8_t>;

const fs::path& temp_root() { return test_util::scratch_root("test_idx"); }

// A fresh, empty directory per call.
fs::path fresh_dir(const std::string& name) {
  const fs::path dir = temp_root() / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

void put_be32(Bytes& out, uint32_t v) {
  out.push_back(static_cast<uint8_t>(v >> 24));
  out.push_back(static_cast<uint8_t>(v >> 16));
  out.push_back(static_cast<uint8_t>(v >> 8));
  out.push_back(static_cast<uint8_t>(v));
}

// Pixel i of the file is (i * 7 + 3) mod 256, so any misplaced byte shows.
Bytes pixel_pattern(size_t n) {
  Bytes p(n);
  for (size_t i = 0; i < n; ++i) p[i] = static_cast<uint8_t>(i * 7 + 3);
  return p;
}

Bytes images_file(uint32_t count, uint32_t rows, uint32_t cols, uint32_t magic = 0x00000803) {
  Bytes out;
  put_be32(out, magic);
  put_be32(out, count);
  put_be32(out, rows);
  put_be32(out, cols);
  const Bytes pixels = pixel_pattern(size_t{count} * rows * cols);
  out.insert(out.end(), pixels.begin(), pixels.end());
  return out;
}

Bytes labels_file(const Bytes& labels, uint32_t magic = 0x00000801) {
  Bytes out;
  put_be32(out, magic);
  put_be32(out, static_cast<uint32_t>(labels.size()));
  out.insert(out.end(), labels.begin(), labels.end());
  return out;
}

Bytes label_pattern(size_t n) {
  Bytes l(n);
  for (size_t i = 0; i < n; ++i) l[i] = static_cast<uint8_t>(i % 10);
  return l;
}

enum class Compression { Plain, Gzip };

std::string write_file(const fs::path& path, const Bytes& bytes,
                       Compression compression = Compression::Plain) {
  if (compression == Compression::Plain) {
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  } else {
    gzFile gz = gzopen(path.string().c_str(), "wb");
    REQUIRE(gz != nullptr);
    if (!bytes.empty())
      REQUIRE(gzwrite(gz, bytes.data(), static_cast<unsigned>(bytes.size())) ==
              static_cast<int>(bytes.size()));
    REQUIRE(gzclose(gz) == Z_OK);
  }
  return path.string();
}

Bytes read_raw(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

template <typename F>
std::string data_error(F&& f) {
  try {
    f();
  } catch (const DataError& e) {
    return e.what();
  }
  return "<no DataError thrown>";
}

std::string image_error(const std::string& path) {
  return data_error([&] { engine::read_idx_images(path); });
}
std::string label_error(const std::string& path) {
  return data_error([&] { engine::read_idx_labels(path); });
}

// A complete small dataset directory; the names are the Fashion-MNIST ones.
void write_dataset(const fs::path& dir, Compression compression, uint32_t train = 12,
                   uint32_t test = 5, uint32_t side = 4) {
  const std::string gz = compression == Compression::Gzip ? ".gz" : "";
  write_file(dir / ("train-images-idx3-ubyte" + gz), images_file(train, side, side), compression);
  write_file(dir / ("train-labels-idx1-ubyte" + gz), labels_file(label_pattern(train)), compression);
  write_file(dir / ("t10k-images-idx3-ubyte" + gz), images_file(test, side, side), compression);
  write_file(dir / ("t10k-labels-idx1-ubyte" + gz), labels_file(label_pattern(test)), compression);
}

// Inflates a whole .gz file with zlib's stream API, independently of the gzread-based loader.
Bytes gunzip(const std::string& path) {
  const Bytes compressed = read_raw(path);
  z_stream zs{};
  REQUIRE(inflateInit2(&zs, 16 + MAX_WBITS) == Z_OK);  // 16: expect a gzip header
  zs.next_in = const_cast<Bytef*>(compressed.data());
  zs.avail_in = static_cast<uInt>(compressed.size());
  Bytes out;
  Bytes chunk(1 << 20);
  int ret = Z_OK;
  while (ret != Z_STREAM_END) {
    zs.next_out = chunk.data();
    zs.avail_out = static_cast<uInt>(chunk.size());
    ret = inflate(&zs, Z_NO_FLUSH);
    REQUIRE((ret == Z_OK || ret == Z_STREAM_END));
    out.insert(out.end(), chunk.begin(), chunk.end() - zs.avail_out);
  }
  inflateEnd(&zs);
  return out;
}

}  // namespace

TEST_CASE("plain and gzipped IDX files read back exactly") {
  const fs::path dir = fresh_dir("roundtrip");
  for (Compression compression : {Compression::Plain, Compression::Gzip}) {
    CAPTURE(static_cast<int>(compression));
    const std::string suffix = compression == Compression::Gzip ? ".gz" : "";
    const Bytes image_bytes = images_file(3, 5, 7);
    const std::string images_path = write_file(dir / ("img" + suffix), image_bytes, compression);
    const engine::IdxImages images = engine::read_idx_images(images_path);
    CHECK(images.count == 3);
    CHECK(images.rows == 5);
    CHECK(images.cols == 7);
    CHECK(images.pixels == Bytes(image_bytes.begin() + 16, image_bytes.end()));

    const Bytes labels{9, 0, 3, 3, 7, 1};
    const std::string labels_path = write_file(dir / ("lbl" + suffix), labels_file(labels), compression);
    CHECK(engine::read_idx_labels(labels_path) == labels);
  }
}

TEST_CASE("an empty image file (count 0) is read as empty") {
  const fs::path dir = fresh_dir("empty");
  const engine::IdxImages images = engine::read_idx_images(write_file(dir / "img", images_file(0, 28, 28)));
  CHECK(images.count == 0);
  CHECK(images.pixels.empty());
  CHECK(engine::read_idx_labels(write_file(dir / "lbl", labels_file({}))).empty());
}

TEST_CASE("wrong magic numbers are reported in hex") {
  const fs::path dir = fresh_dir("magic");
  // A label file where images are expected, and the other way round.
  const std::string labels_path = write_file(dir / "labels", labels_file({1, 2}));
  const std::string images_path = write_file(dir / "images", images_file(1, 2, 2));
  CHECK(image_error(labels_path) ==
        labels_path + ": wrong magic number: expected 0x00000803 (IDX image file), found 0x00000801");
  CHECK(label_error(images_path) ==
        images_path + ": wrong magic number: expected 0x00000801 (IDX label file), found 0x00000803");

  // A file that is not IDX at all, such as a doubly gzipped one.
  const std::string text_path = write_file(dir / "text", Bytes{'h', 'e', 'l', 'l', 'o', '!', '!', '!'});
  CHECK(contains(label_error(text_path), "found 0x68656C6C"));
}

TEST_CASE("truncated headers") {
  const fs::path dir = fresh_dir("header");
  Bytes image_header = images_file(2, 3, 3);
  image_header.resize(6);
  for (Compression compression : {Compression::Plain, Compression::Gzip}) {
    const std::string path = write_file(dir / "img", image_header, compression);
    CHECK(image_error(path) == path + ": truncated header: expected 16 bytes, found 6");
  }
  const std::string tiny = write_file(dir / "tiny", Bytes{0, 0});
  CHECK(image_error(tiny) == tiny + ": truncated header: expected 4 bytes, found 2");
  const std::string empty = write_file(dir / "empty", Bytes{});
  CHECK(label_error(empty) == empty + ": truncated header: expected 4 bytes, found 0");
  Bytes label_header = labels_file({1, 2, 3});
  label_header.resize(7);
  const std::string lbl = write_file(dir / "lbl", label_header);
  CHECK(label_error(lbl) == lbl + ": truncated header: expected 8 bytes, found 7");
}

TEST_CASE("truncated data says how many bytes were expected and found") {
  const fs::path dir = fresh_dir("data");
  Bytes images = images_file(4, 3, 3);  // 16 + 36 bytes
  images.resize(40);
  for (Compression compression : {Compression::Plain, Compression::Gzip}) {
    const std::string path = write_file(dir / "img", images, compression);
    CHECK(image_error(path) == path + ": truncated pixel data: expected 52 bytes, found 40");
  }
  Bytes labels = labels_file({1, 2, 3, 4, 5});
  labels.pop_back();
  const std::string lbl = write_file(dir / "lbl", labels);
  CHECK(label_error(lbl) == lbl + ": truncated label data: expected 13 bytes, found 12");

  // A gzip stream cut short: the bytes that did inflate are counted, the rest are missing.
  const std::string gz = write_file(dir / "cut.gz", images_file(50, 20, 20), Compression::Gzip);
  Bytes compressed = read_raw(gz);
  compressed.resize(compressed.size() / 2);
  const std::string cut = write_file(dir / "cut2.gz", compressed);
  const std::string msg = image_error(cut);
  INFO(msg);
  CHECK(contains(msg, cut + ": "));
  CHECK((contains(msg, "truncated pixel data: expected 20016 bytes, found") ||
         contains(msg, "corrupt gzip data")));
}

TEST_CASE("bytes after the declared data are rejected") {
  const fs::path dir = fresh_dir("trailing");
  Bytes labels = labels_file({1, 2, 3});
  labels.push_back(4);
  const std::string path = write_file(dir / "lbl", labels);
  CHECK(label_error(path) == path + ": unexpected data after the 11 bytes that the header declares");
}

TEST_CASE("corrupt gzip data is an error, not silently short data") {
  const fs::path dir = fresh_dir("corrupt");
  const std::string gz = write_file(dir / "img.gz", images_file(50, 20, 20), Compression::Gzip);
  Bytes compressed = read_raw(gz);
  for (size_t i = 20; i < compressed.size() - 8; i += 3) compressed[i] ^= 0x5A;
  const std::string bad = write_file(dir / "bad.gz", compressed);
  const std::string msg = image_error(bad);
  INFO(msg);
  CHECK(contains(msg, bad + ": corrupt gzip data: "));
  CHECK(msg.find(bad) == msg.rfind(bad));  // the path once, not repeated by zlib's message
}

TEST_CASE("absurd dimensions are rejected before allocating") {
  const fs::path dir = fresh_dir("dims");
  struct Case {
    uint32_t count, rows, cols;
  };
  for (const Case& c : {Case{0xFFFFFFFFu, 28, 28}, Case{100'000'001, 1, 1}, Case{10, 0, 28},
                        Case{10, 28, 0}, Case{10, 4097, 28}, Case{10, 28, 0x80000000u}}) {
    Bytes header;
    put_be32(header, 0x00000803);
    put_be32(header, c.count);
    put_be32(header, c.rows);
    put_be32(header, c.cols);
    const std::string path = write_file(dir / "img", header);
    const std::string msg = image_error(path);
    INFO(msg);
    CHECK(contains(msg, path + ": implausible header: " + std::to_string(c.count) + " images of " +
                            std::to_string(c.rows) + "x" + std::to_string(c.cols)));
  }
  Bytes header;
  put_be32(header, 0x00000801);
  put_be32(header, 0xFFFFFFFFu);
  const std::string path = write_file(dir / "lbl", header);
  CHECK(contains(label_error(path), path + ": implausible header: 4294967295 labels"));

  // The largest accepted header with no data behind it fails as truncated, cheaply.
  Bytes big_header;
  put_be32(big_header, 0x00000803);
  put_be32(big_header, 100'000'000);
  put_be32(big_header, 4096);
  put_be32(big_header, 4096);
  const std::string big = write_file(dir / "big", big_header);
  CHECK(contains(image_error(big), "truncated pixel data: expected 1677721600000016 bytes, found 16"));
}

TEST_CASE("labels outside 0..9 are rejected with their index") {
  const fs::path dir = fresh_dir("labels");
  const std::string path = write_file(dir / "lbl.gz", labels_file({0, 9, 4, 12, 3}), Compression::Gzip);
  CHECK(label_error(path) == path + ": label 12 at index 3 is not a class index in 0..9");
  const std::string path2 = write_file(dir / "lbl2", labels_file({10}));
  CHECK(label_error(path2) == path2 + ": label 10 at index 0 is not a class index in 0..9");
}

TEST_CASE("unreadable paths are named") {
  const fs::path dir = fresh_dir("nofile");
  const std::string path = (dir / "nothing.gz").string();
  CHECK(image_error(path) == path + ": cannot open: No such file or directory");
  CHECK(label_error(dir.string()) == dir.string() + ": is a directory, not a file");
}

TEST_CASE("load_fashion_mnist reads a directory of plain or gzipped files") {
  for (Compression compression : {Compression::Plain, Compression::Gzip}) {
    CAPTURE(static_cast<int>(compression));
    const fs::path dir = fresh_dir("dataset");
    write_dataset(dir, compression, 12, 5, 4);
    const engine::FashionMnist data = engine::load_fashion_mnist(dir.string());
    CHECK(data.train_images.count == 12);
    CHECK(data.train_images.rows == 4);
    CHECK(data.train_images.cols == 4);
    CHECK(data.train_images.pixels == pixel_pattern(12 * 16));
    CHECK(data.train_labels == label_pattern(12));
    CHECK(data.test_images.count == 5);
    CHECK(data.test_images.pixels == pixel_pattern(5 * 16));
    CHECK(data.test_labels == label_pattern(5));
  }
}

TEST_CASE("load_fashion_mnist checks each pair and the shared image size") {
  SUBCASE("train count mismatch") {
    const fs::path dir = fresh_dir("mismatch");
    write_dataset(dir, Compression::Gzip);
    write_file(dir / "train-labels-idx1-ubyte.gz", labels_file(label_pattern(11)), Compression::Gzip);
    const std::string msg = data_error([&] { engine::load_fashion_mnist(dir.string()); });
    CHECK(msg == (dir / "train-images-idx3-ubyte.gz").string() + " has 12 images but " +
                     (dir / "train-labels-idx1-ubyte.gz").string() + " has 11 labels");
  }
  SUBCASE("test count mismatch") {
    const fs::path dir = fresh_dir("mismatch_test");
    write_dataset(dir, Compression::Plain);
    write_file(dir / "t10k-images-idx3-ubyte", images_file(6, 4, 4));
    const std::string msg = data_error([&] { engine::load_fashion_mnist(dir.string()); });
    CHECK(contains(msg, "t10k-images-idx3-ubyte has 6 images but "));
    CHECK(contains(msg, "t10k-labels-idx1-ubyte has 5 labels"));
  }
  SUBCASE("test images of another size") {
    const fs::path dir = fresh_dir("sizes");
    write_dataset(dir, Compression::Plain);
    write_file(dir / "t10k-images-idx3-ubyte", images_file(5, 4, 5));
    const std::string msg = data_error([&] { engine::load_fashion_mnist(dir.string()); });
    CHECK(contains(msg, "t10k-images-idx3-ubyte: images are 4x5 but "));
  }
  SUBCASE("no training images") {
    const fs::path dir = fresh_dir("none");
    write_dataset(dir, Compression::Plain, 0, 5);
    CHECK(contains(data_error([&] { engine::load_fashion_mnist(dir.string()); }),
                   "train-images-idx3-ubyte: contains no images"));
  }
  SUBCASE("errors inside a file name that file") {
    const fs::path dir = fresh_dir("badlabel");
    write_dataset(dir, Compression::Plain);
    write_file(dir / "t10k-labels-idx1-ubyte", labels_file({1, 2, 3, 4, 200}));
    CHECK(data_error([&] { engine::load_fashion_mnist(dir.string()); }) ==
          (dir / "t10k-labels-idx1-ubyte").string() +
              ": label 200 at index 4 is not a class index in 0..9");
  }
}

TEST_CASE("a missing directory or file says how to install the dataset") {
  SUBCASE("missing directory") {
    const std::string dir = (fresh_dir("missing") / "no_such_dir").string();
    const std::string msg = data_error([&] { engine::load_fashion_mnist(dir); });
    CHECK(msg == "data directory '" + dir +
                     "' not found (key data.dir); install the dataset with: apt-get install "
                     "dataset-fashion-mnist (as root, or with sudo)");
    CHECK(contains(msg, "apt-get install dataset-fashion-mnist"));
    CHECK(contains(msg, "data.dir"));
  }
  SUBCASE("missing file in an existing directory") {
    const fs::path dir = fresh_dir("partial");
    write_dataset(dir, Compression::Gzip);
    fs::remove(dir / "t10k-labels-idx1-ubyte.gz");
    const std::string msg = data_error([&] { engine::load_fashion_mnist(dir.string()); });
    INFO(msg);
    CHECK(contains(msg, "'t10k-labels-idx1-ubyte'"));
    CHECK(contains(msg, dir.string()));
    CHECK(contains(msg, "data.dir"));
    CHECK(contains(msg, "apt-get install dataset-fashion-mnist"));
  }
}

TEST_CASE("the installed Fashion-MNIST dataset") {
  if (!fs::is_directory(kRealDataset)) {
    MESSAGE("skipped: " << kRealDataset << " is not installed");
    return;
  }
  const engine::FashionMnist data = engine::load_fashion_mnist(kRealDataset);
  CHECK(data.train_images.count == 60000);
  CHECK(data.test_images.count == 10000);
  CHECK(data.train_images.rows == 28);
  CHECK(data.train_images.cols == 28);
  CHECK(data.test_images.rows == 28);
  CHECK(data.test_images.cols == 28);
  CHECK(data.train_images.pixels.size() == size_t{60000} * 28 * 28);
  CHECK(data.test_images.pixels.size() == size_t{10000} * 28 * 28);
  CHECK(data.train_labels.size() == 60000);
  CHECK(data.test_labels.size() == 10000);

  // Compare with an independent decode (zlib's inflate, header skipped by hand).
  const fs::path root(kRealDataset);
  const Bytes train_labels = gunzip((root / "train-labels-idx1-ubyte.gz").string());
  REQUIRE(train_labels.size() == 8 + 60000);
  CHECK(data.train_labels == Bytes(train_labels.begin() + 8, train_labels.end()));
  // The first training item of Fashion-MNIST is an ankle boot, class 9.
  CHECK(train_labels[8] == 9);
  CHECK(data.train_labels[0] == 9);

  const Bytes test_labels = gunzip((root / "t10k-labels-idx1-ubyte.gz").string());
  CHECK(data.test_labels == Bytes(test_labels.begin() + 8, test_labels.end()));
  const Bytes train_images = gunzip((root / "train-images-idx3-ubyte.gz").string());
  CHECK(data.train_images.pixels == Bytes(train_images.begin() + 16, train_images.end()));
  const Bytes test_images = gunzip((root / "t10k-images-idx3-ubyte.gz").string());
  CHECK(data.test_images.pixels == Bytes(test_images.begin() + 16, test_images.end()));

  // Every class appears equally often: 6000 per class in train, 1000 in test.
  std::vector<int> per_class(10, 0);
  for (uint8_t label : data.train_labels) ++per_class[label];
  for (int n : per_class) CHECK(n == 6000);
}
