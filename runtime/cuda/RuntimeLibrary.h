// A CUDA library opened at run time (cuBLAS, cuBLASLt, cuDNN, NCCL): the
// CUDA backend loads nothing of CUDA unless a CUDA backend is asked for
// (runtime/cuda/CudaBackend.cpp says why), so each library's entry points
// are looked up by name when it is first needed. A library that cannot be
// opened, or lacks an entry point, leaves `error` saying which.
#pragma once

#include <dlfcn.h>

#include <initializer_list>
#include <string>
#include <type_traits>

namespace cleave::runtime::cuda {

class RuntimeLibrary {
public:
  // The first of `paths` that opens; `what` names the library in errors.
  RuntimeLibrary(std::initializer_list<const char *> paths, const char *what)
      : what_(what) {
    for (const char *p : paths)
      if (!handle_)
        handle_ = dlopen(p, RTLD_NOW | RTLD_LOCAL);
    if (!handle_)
      error = std::string("cannot load ") + what + " (" + *paths.begin() +
              "): " + dlerror();
  }
  // Sets `fn` to the entry point `name` (null, and `error` set, when
  // missing).
  template <typename Fn> void bind(Fn &fn, const char *name) {
    fn = handle_ ? reinterpret_cast<std::remove_reference_t<Fn>>(
                       dlsym(handle_, name))
                 : nullptr;
    if (!fn && error.empty())
      error = std::string(what_) + " lacks " + name;
  }

  // An entry point that may be missing (null then; `error` untouched).
  void *find(const char *name) const {
    return handle_ ? dlsym(handle_, name) : nullptr;
  }

  std::string error; // empty: every entry point bound

private:
  const char *what_;
  void *handle_ = nullptr;
};

} // namespace cleave::runtime::cuda
