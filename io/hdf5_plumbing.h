// Private to io/: HDF5 plumbing: quiet errors, owned handles, failures turned into
// CheckpointError naming the file.
#pragma once
#include <hdf5.h>

#include <string>

#include "io/checkpoint_format.h"

namespace engine {
namespace checkpoint_internal {

inline herr_t take_innermost_error(unsigned n, const H5E_error2_t* err, void* out) {
  if (n == 0 && err && err->desc) {
    try {
      *static_cast<std::string*>(out) = err->desc;
    } catch (...) {
    }
  }
  return 0;
}

inline std::string hdf5_reason() {
  std::string reason;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, take_innermost_error, &reason);
  H5Eclear2(H5E_DEFAULT);
  return reason.empty() ? "" : " (HDF5: " + reason + ")";
}

// Silences HDF5's error printing and disables filter plugins (a file must not make us
// load code) for the duration of one public call, then restores the caller's settings.
class Hdf5Session {
 public:
  Hdf5Session() {
    H5open();
    H5Eget_auto2(H5E_DEFAULT, &func_, &data_);
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    have_plugins_ = H5PLget_loading_state(&plugins_) >= 0;
    H5PLset_loading_state(0);
  }
  ~Hdf5Session() {
    if (have_plugins_) H5PLset_loading_state(plugins_);
    H5Eset_auto2(H5E_DEFAULT, func_, data_);
  }
  Hdf5Session(const Hdf5Session&) = delete;
  Hdf5Session& operator=(const Hdf5Session&) = delete;

 private:
  H5E_auto2_t func_ = nullptr;
  void* data_ = nullptr;
  unsigned plugins_ = 0;
  bool have_plugins_ = false;
};

class H5Handle {
 public:
  using Closer = herr_t (*)(hid_t);
  H5Handle() = default;
  H5Handle(hid_t id, Closer close) : id_(id), close_(close) {}
  H5Handle(H5Handle&& o) noexcept : id_(o.id_), close_(o.close_) { o.id_ = -1; }
  H5Handle& operator=(H5Handle&& o) noexcept {
    if (this != &o) {
      reset();
      id_ = o.id_;
      close_ = o.close_;
      o.id_ = -1;
    }
    return *this;
  }
  H5Handle(const H5Handle&) = delete;
  H5Handle& operator=(const H5Handle&) = delete;
  ~H5Handle() { reset(); }

  hid_t get() const { return id_; }
  // Gives up ownership without closing (the caller closed it or hands it on).
  hid_t release() {
    const hid_t id = id_;
    id_ = -1;
    return id;
  }
  void reset() {
    if (id_ >= 0 && close_) close_(id_);
    id_ = -1;
  }

 private:
  hid_t id_ = -1;
  Closer close_ = nullptr;
};

// Names the file in every error and checks every HDF5 call.
struct H5Ctx {
  std::string path;

  [[noreturn]] void fail(const std::string& msg) const { checkpoint_internal::fail(path, msg); }
  H5Handle own(hid_t id, H5Handle::Closer close, const std::string& what) const {
    if (id < 0) fail(what + hdf5_reason());
    return H5Handle(id, close);
  }
  void ok(herr_t r, const std::string& what) const {
    if (r < 0) fail(what + hdf5_reason());
  }
  H5Handle copy_type(hid_t predefined) const {
    return own(H5Tcopy(predefined), H5Tclose, "cannot copy an HDF5 datatype");
  }
  H5Handle plist(hid_t cls, const std::string& what) const {
    return own(H5Pcreate(cls), H5Pclose, "cannot create " + what);
  }
};

}  // namespace checkpoint_internal
}  // namespace engine
