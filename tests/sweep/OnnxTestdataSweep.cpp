// The libonnx-testdata sweep: imports every model.onnx under the given
// folders (the official ONNX backend test cases), and for each one that
// imports, verifies it and checks that its IR text round-trips. A model may
// instead be rejected, but only with one of the "cleave does not support
// this" errors (op, opset, element type, non-static shape, ...). Any other
// error, an invalid graph or a round-trip difference fails the sweep; a
// crash fails it too (the run dies). Prints the counts per folder and the
// reasons for rejection.
#include "frontend/OnnxImporter.h"
#include "ir/Parser.h"
#include "ir/Printer.h"
#include "ir/Verifier.h"
#include "passes/Pass.h"

#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/raw_ostream.h"

#include <algorithm>
#include <map>
#include <string>
#include <vector>

using namespace cleave;

// The families of "not supported" errors, by a phrase each contains.
static const char *const kUnsupported[][2] = {
    {"unsupported op", "unsupported op"},
    {"cleave supports opsets", "opset outside 7-28"},
    {"has a symbolic dimension", "symbolic dimension left unbound"},
    {"imports no opset of the default", "no default-domain opset"},
    {"is not supported (cleave supports", "element type"},
    {"is not a tensor", "non-tensor input (sequence, optional)"},
    {"must be a constant", "static operand given at runtime"},
    {"depends on runtime data", "shape depends on runtime data"},
    {"too many to fold", "constant too large to fold"},
    {"experimental ONNX op", "experimental op"},
    {"takes uint8 only in shape arithmetic", "uint8 computed at run time"},
    {"is not supported", "unsupported attribute or mode"},
    // An ONNX input the IR op takes as an attribute (CumSum's axis,
    // Resize's sizes or scales, Tile's repeats) that the importer does not
    // fold into it yet.
    {"missing required attribute", "input not yet folded into an attribute"},
};

static std::string classify(const std::string &msg) {
  for (const auto &u : kUnsupported)
    if (msg.find(u[0]) != std::string::npos)
      return u[1];
  return "";
}

int main(int argc, char **argv) {
  if (argc < 2) {
    llvm::errs() << "usage: onnx-testdata-sweep DIR...\n";
    return 2;
  }
  frontend::installOnnxDataResolver();
  int imported = 0, rejected = 0, failed = 0, total = 0;
  std::map<std::string, int> reasons;
  for (int a = 1; a < argc; ++a) {
    std::vector<std::string> cases;
    std::error_code ec;
    for (llvm::sys::fs::directory_iterator it(argv[a], ec), end;
         it != end && !ec; it.increment(ec)) {
      llvm::SmallString<256> model(it->path());
      llvm::sys::path::append(model, "model.onnx");
      if (llvm::sys::fs::exists(model))
        cases.push_back(std::string(model));
    }
    if (ec || cases.empty()) {
      llvm::errs() << "sweep: no test cases under '" << argv[a]
                   << "' (is libonnx-testdata installed?)\n";
      return 1;
    }
    std::sort(cases.begin(), cases.end());
    int dirImported = 0, dirRejected = 0, dirFailed = 0;
    for (const std::string &path : cases) {
      ++total;
      frontend::ImportOptions opts;
      opts.differentiate = passes::differentiate; // ONNX's Gradient op
      auto g = frontend::importOnnxFile(path, opts);
      if (!g) {
        std::string msg = llvm::toString(g.takeError());
        std::string why = classify(msg);
        if (why.empty()) {
          llvm::outs() << "FAIL " << path << ": " << msg << "\n";
          ++dirFailed;
        } else {
          ++reasons[why];
          ++dirRejected;
        }
        continue;
      }
      if (auto e = ir::verifyGraph(**g)) {
        llvm::outs() << "FAIL " << path << ": invalid IR: "
                     << llvm::toString(std::move(e)) << "\n";
        ++dirFailed;
        continue;
      }
      std::string text = ir::printGraph(**g);
      auto back = ir::parseGraph(text, path);
      if (!back) {
        llvm::outs() << "FAIL " << path << ": printed IR does not parse: "
                     << llvm::toString(back.takeError()) << "\n";
        ++dirFailed;
        continue;
      }
      if (auto e = ir::verifyGraph(**back)) {
        llvm::outs() << "FAIL " << path << ": reparsed IR is invalid: "
                     << llvm::toString(std::move(e)) << "\n";
        ++dirFailed;
        continue;
      }
      if (ir::printGraph(**back) != text) {
        llvm::outs() << "FAIL " << path << ": IR text does not round-trip\n";
        ++dirFailed;
        continue;
      }
      ++dirImported;
    }
    llvm::outs() << llvm::sys::path::filename(argv[a]) << ": " << cases.size()
                 << " models, " << dirImported << " imported, " << dirRejected
                 << " rejected as unsupported, " << dirFailed << " failed\n";
    imported += dirImported;
    rejected += dirRejected;
    failed += dirFailed;
  }
  llvm::outs() << "total: " << total << " models, " << imported
               << " imported and round-tripped, " << rejected
               << " rejected as unsupported, " << failed << " failed\n";
  llvm::outs() << "rejections by reason:\n";
  for (const auto &[why, n] : reasons)
    llvm::outs() << "  " << n << "  " << why << "\n";
  return failed ? 1 : 0;
}
