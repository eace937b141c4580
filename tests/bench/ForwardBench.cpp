// cleave-bench-forward: times the forward pass of an ONNX model on the CPU
// backend through the reference interpreter. Imports once, builds the
// interpreter once, feeds inputs from .npy files (or zeros), runs a few
// warm-up iterations and then N timed ones; prints the median and minimum
// milliseconds per iteration and the first output's first value, so a
// caller can check the result against another framework.
//
// usage: cleave-bench-forward MODEL.onnx [--microbatch-size N]
//          [--inputs DIR] [--iters N] [--threads N]
#include "frontend/OnnxImporter.h"
#include "frontend/TensorFiles.h"
#include "runtime/data/NumpyFiles.h"
#include "interp/Interpreter.h"
#include "ir/Verifier.h"
#include "passes/Pass.h"

#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/raw_ostream.h"

#include <algorithm>
#include <chrono>

using namespace cleave;

static int die(const std::string &msg) {
  llvm::errs() << "cleave-bench-forward: error: " << msg << "\n";
  return 1;
}

int main(int argc, char **argv) {
  std::string model, inputDir;
  frontend::ImportOptions opts;
  opts.differentiate = passes::differentiate; // ONNX's Gradient op
  int iters = 20, threads = 0;
  for (int i = 1; i < argc; ++i) {
    llvm::StringRef a = argv[i];
    auto next = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (a == "--microbatch-size")
      opts.microbatchSize = std::stoll(next());
    else if (a == "--inputs")
      inputDir = next();
    else if (a == "--iters")
      iters = std::stoi(next());
    else if (a == "--threads")
      threads = std::stoi(next());
    else
      model = a.str();
  }
  if (model.empty())
    return die("usage: cleave-bench-forward MODEL.onnx [--microbatch-size N] "
               "[--inputs DIR] [--iters N] [--threads N]");
  auto g = frontend::importOnnxFile(model, opts);
  if (!g)
    return die(llvm::toString(g.takeError()));
  if (auto e = ir::verifyGraph(**g))
    return die(llvm::toString(std::move(e)));
  std::vector<interp::Tensor> inputs;
  for (const ir::Value *v : (*g)->inputs()) {
    if (!inputDir.empty()) {
      llvm::SmallString<256> p(inputDir);
      llvm::sys::path::append(p, v->name() + ".npy");
      auto t = runtime::readNpyFile(std::string(p));
      if (!t)
        return die(llvm::toString(t.takeError()));
      inputs.push_back(*t);
    } else {
      inputs.push_back(std::make_shared<ir::TensorData>(
          v->type(), std::string(v->type().byteSize(), '\0')));
    }
  }
  auto backend = runtime::createCpuBackend(threads);
  auto interp = interp::Interpreter::create(**g, *backend);
  if (!interp)
    return die(llvm::toString(interp.takeError()));
  std::vector<double> ms;
  interp::Tensor first;
  for (int i = 0; i < iters + 3; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    auto out = (*interp)->run(inputs);
    auto t1 = std::chrono::steady_clock::now();
    if (!out)
      return die(llvm::toString(out.takeError()));
    first = (*out)[0];
    if (i >= 3)
      ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  llvm::outs() << "median_ms " << ms[ms.size() / 2] << "\n"
               << "min_ms " << ms[0] << "\n"
               << "arena_bytes " << (*interp)->arenaBytes() << "\n"
               << "output0 " << first->getDouble(0) << "\n";
  return 0;
}
