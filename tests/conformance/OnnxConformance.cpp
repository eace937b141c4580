// The ONNX backend conformance suite: runs every case of Debian's
// libonnx-testdata (model.onnx + test_data_set_N/{input,output}_K.pb) whose
// model cleave imports, on the CPU backend through the reference
// interpreter, and compares every output with rtol 1e-3 and atol 1e-5
// (|got - want| <= atol + rtol * |want|; NaN matches NaN; integers and
// booleans exactly).
//
// A case may fail only if tests/conformance/expected_failures.txt lists it
// with a reason; a listed case that passes is also an error, so the list
// stays true. Models that pass static operands (a Reshape target, Slice
// bounds) as graph inputs run with those inputs fixed to each data set's
// values. Cases for the ops the project's bar names (Gemm, MatMul, Conv,
// LayerNormalization, Softmax, SoftmaxCrossEntropyLoss, BatchNormalization,
// Gather, Transpose, Reshape, Split, Where) may not be listed at all.
//
// usage: onnx-conformance [--expected FILE] [--table FILE.md] DIR...
#include "frontend/OnnxImporter.h"
#include "frontend/TensorFiles.h"
#include "interp/Interpreter.h"
#include "passes/Pass.h"

#include "llvm/ADT/StringRef.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/raw_ostream.h"

#include <cmath>
#include <map>
#include <set>

using namespace cleave;

static constexpr double kRtol = 1e-3, kAtol = 1e-5;

static const std::set<std::string> kMustPass = {
    "Gemm",    "MatMul",  "Conv",    "LayerNormalization",
    "Softmax", "SoftmaxCrossEntropyLoss", "BatchNormalization",
    "Gather",  "Transpose", "Reshape", "Split", "Where"};

static std::string join(llvm::StringRef a, llvm::StringRef b) {
  llvm::SmallString<256> p(a);
  llvm::sys::path::append(p, b);
  return std::string(p);
}

// Compares one output; returns "" when it matches, else what differs.
static std::string compare(const ir::TensorData &got,
                           const ir::TensorData &want) {
  if (got.type() != want.type())
    return "type " + got.type().str() + ", expected " + want.type().str();
  int64_t n = want.type().numElements();
  bool fl = ir::isFloat(want.type().dtype);
  for (int64_t i = 0; i < n; ++i) {
    if (fl) {
      double g = got.getDouble(i), w = want.getDouble(i);
      if (std::isnan(w) && std::isnan(g))
        continue;
      if (std::isinf(w) && g == w)
        continue;
      if (!(std::fabs(g - w) <= kAtol + kRtol * std::fabs(w)))
        return llvm::formatv("element {0}: {1}, expected {2}", i, g, w).str();
    } else if (got.getInt(i) != want.getInt(i)) {
      return llvm::formatv("element {0}: {1}, expected {2}", i, got.getInt(i),
                           want.getInt(i))
          .str();
    }
  }
  return "";
}

// Imports a case's model for one data set. Models that pass static
// operands (a Reshape target, Slice bounds, Clip limits) as graph inputs are
// imported again with those inputs fixed to the data set's values, one at a
// time as the importer names them.
static llvm::Expected<std::unique_ptr<ir::Graph>>
importForDataSet(const std::string &model, const std::string &set,
                 llvm::ArrayRef<std::string> onnxInputs) {
  frontend::ImportOptions opts;
  opts.differentiate = passes::differentiate; // ONNX's Gradient op
  for (size_t attempt = 0;; ++attempt) {
    auto g = frontend::importOnnxFile(model, opts);
    if (g || attempt >= onnxInputs.size())
      return g;
    std::string msg = llvm::toString(g.takeError());
    bool staticOperand = msg.find("must be a constant") != std::string::npos ||
                         msg.find("depends on runtime data") !=
                             std::string::npos;
    size_t q = msg.find("input '");
    std::string name = q == std::string::npos
                           ? ""
                           : msg.substr(q + 7, msg.find('\'', q + 7) - q - 7);
    auto it = std::find(onnxInputs.begin(), onnxInputs.end(), name);
    if (!staticOperand || it == onnxInputs.end() ||
        opts.constantInputs.count(name))
      return llvm::createStringError(llvm::inconvertibleErrorCode(), msg);
    auto t = frontend::readTensorProtoFile(join(
        set, "input_" + std::to_string(it - onnxInputs.begin()) + ".pb"));
    if (!t)
      return t.takeError();
    opts.constantInputs[name] = *t;
  }
}

// Runs every data set of one case; returns "" on success or the first
// problem. `imported` tells whether the model imports at all.
static std::string runCase(const std::string &dir, runtime::Backend &backend,
                           bool &imported, std::set<std::string> &ops) {
  std::string model = join(dir, "model.onnx");
  auto onnxInputs = frontend::onnxInputNames(model);
  if (!onnxInputs) {
    llvm::consumeError(onnxInputs.takeError());
    imported = false;
    return "";
  }
  imported = true;
  int sets = 0;
  for (int s = 0;; ++s) {
    std::string set = join(dir, "test_data_set_" + std::to_string(s));
    if (!llvm::sys::fs::is_directory(set))
      break;
    ++sets;
    auto g = importForDataSet(model, set, *onnxInputs);
    if (!g) {
      llvm::consumeError(g.takeError());
      imported = false;
      return "";
    }
    for (const auto &op : (*g)->ops())
      ops.insert(std::string(op->name()));
    auto interp = interp::Interpreter::create(**g, backend);
    if (!interp)
      return llvm::toString(interp.takeError());
    std::vector<interp::Tensor> inputs;
    for (const ir::Value *v : (*g)->inputs()) {
      auto k = std::find(onnxInputs->begin(), onnxInputs->end(), v->name()) -
               onnxInputs->begin();
      auto t = frontend::readTensorProtoFile(
          join(set, "input_" + std::to_string(k) + ".pb"));
      if (!t)
        return llvm::toString(t.takeError());
      inputs.push_back(*t);
    }
    auto outputs = (*interp)->run(inputs);
    if (!outputs)
      return llvm::toString(outputs.takeError());
    for (size_t k = 0; k < outputs->size(); ++k) {
      auto want = frontend::readTensorProtoFile(
          join(set, "output_" + std::to_string(k) + ".pb"));
      if (!want)
        return llvm::toString(want.takeError());
      std::string diff = compare(*(*outputs)[k], **want);
      if (!diff.empty())
        return "data set " + std::to_string(s) + ", output " +
               std::to_string(k) + " (" + (*g)->outputs()[k]->name() +
               "): " + diff;
    }
  }
  if (sets == 0)
    return "no test_data_set folders";
  return "";
}

int main(int argc, char **argv) {
  std::string expectedPath, tablePath;
  std::vector<std::string> roots;
  for (int i = 1; i < argc; ++i) {
    llvm::StringRef a = argv[i];
    if (a == "--expected" && i + 1 < argc)
      expectedPath = argv[++i];
    else if (a == "--table" && i + 1 < argc)
      tablePath = argv[++i];
    else
      roots.push_back(a.str());
  }
  if (roots.empty()) {
    llvm::errs() << "usage: onnx-conformance [--expected FILE] [--table "
                    "FILE.md] DIR...\n";
    return 2;
  }
  // expected_failures.txt: `case_name  reason...`, '#' comments.
  std::map<std::string, std::string> expected;
  if (!expectedPath.empty()) {
    auto buf = llvm::MemoryBuffer::getFile(expectedPath, true);
    if (!buf) {
      llvm::errs() << "cannot read " << expectedPath << "\n";
      return 2;
    }
    llvm::SmallVector<llvm::StringRef, 64> lines;
    (*buf)->getBuffer().split(lines, '\n');
    for (llvm::StringRef line : lines) {
      line = line.trim();
      if (line.empty() || line.startswith("#"))
        continue;
      auto [name, reason] = line.split(' ');
      if (reason.trim().empty()) {
        llvm::errs() << "expected failure '" << name << "' has no reason\n";
        return 2;
      }
      expected[name.str()] = reason.trim().str();
    }
  }

  frontend::installOnnxDataResolver();
  auto backend = runtime::createCpuBackend();
  struct OpRow {
    int cases = 0, passed = 0, xfail = 0, failed = 0;
  };
  std::map<std::string, OpRow> table;
  int supported = 0, passed = 0, xfail = 0, failed = 0, unsupported = 0,
      xpass = 0;
  std::set<std::string> seen;
  for (const std::string &root : roots) {
    std::vector<std::string> cases;
    std::error_code ec;
    for (llvm::sys::fs::directory_iterator it(root, ec), end; it != end && !ec;
         it.increment(ec))
      if (llvm::sys::fs::exists(join(it->path(), "model.onnx")))
        cases.push_back(it->path());
    std::sort(cases.begin(), cases.end());
    if (cases.empty()) {
      llvm::errs() << "no test cases under '" << root
                   << "' (is libonnx-testdata installed?)\n";
      return 1;
    }
    for (const std::string &dir : cases) {
      std::string name = llvm::sys::path::filename(dir).str();
      seen.insert(name);
      bool imported = false;
      std::set<std::string> ops;
      std::string problem = runCase(dir, *backend, imported, ops);
      if (!imported) {
        ++unsupported;
        continue;
      }
      ++supported;
      bool isExpected = expected.count(name);
      for (const std::string &op : ops) {
        OpRow &row = table[op];
        ++row.cases;
        if (problem.empty())
          ++row.passed;
        else if (isExpected)
          ++row.xfail;
        else
          ++row.failed;
      }
      if (problem.empty() && isExpected) {
        llvm::outs() << "XPASS " << name
                     << ": listed as an expected failure but passes; "
                        "remove it from the list\n";
        ++xpass;
        ++passed;
      } else if (problem.empty()) {
        ++passed;
      } else if (isExpected) {
        ++xfail;
      } else {
        llvm::outs() << "FAIL " << name << ": " << problem << "\n";
        ++failed;
      }
      if (!problem.empty())
        for (const std::string &op : ops)
          if (kMustPass.count(op)) {
            llvm::outs() << "BAR " << name << " exercises " << op
                         << ", which must pass: " << problem << "\n";
            ++failed;
            break;
          }
    }
  }
  for (const auto &[name, reason] : expected)
    if (!seen.count(name)) {
      llvm::outs() << "STALE " << name
                   << ": listed as an expected failure but no such case\n";
      ++failed;
    }
  double rate = supported ? 100.0 * passed / supported : 0;
  llvm::outs() << llvm::formatv(
      "conformance (rtol {0:e1}, atol {1:e1}): {2} cases cleave imports, {3} "
      "passed ({4:f1}%), {5} expected failures, {6} failed; {7} cases "
      "unsupported\n",
      kRtol, kAtol, supported, passed, rate, xfail, failed, unsupported);
  if (!tablePath.empty()) {
    std::string md = "| op | cases | passed | expected failures |\n"
                     "| --- | ---: | ---: | ---: |\n";
    for (const auto &[op, row] : table)
      md += llvm::formatv("| {0} | {1} | {2} | {3} |\n", op, row.cases,
                          row.passed, row.xfail + row.failed)
                .str();
    std::error_code ec;
    llvm::raw_fd_ostream os(tablePath, ec);
    if (!ec)
      os << md;
  }
  return failed || xpass ? 1 : 0;
}
