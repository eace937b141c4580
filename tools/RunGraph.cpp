#include "tools/RunGraph.h"
#include "support/Errors.h"

#include "frontend/TensorFiles.h"
#include "runtime/data/NumpyFiles.h"
#include "interp/Interpreter.h"
#include "runtime/Stages.h"

#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Path.h"

namespace cleave::tools {

static std::string join(const std::string &dir, const std::string &file) {
  llvm::SmallString<256> p(dir);
  llvm::sys::path::append(p, file);
  return std::string(p);
}

llvm::Error runGraphOnFiles(const ir::Graph &g, const std::string &inputDir,
                            const std::string &outputDir,
                            const std::string &device, llvm::raw_ostream &log) {
  if (!llvm::sys::fs::is_directory(inputDir))
    return cleave::fail("--inputs '" + inputDir + "' is not a folder");
  bool pb = llvm::sys::fs::exists(join(inputDir, "input_0.pb")) ||
            g.inputs().empty();
  std::vector<interp::Tensor> inputs;
  for (size_t k = 0; k < g.inputs().size(); ++k) {
    const ir::Value *v = g.inputs()[k];
    std::string path = pb ? join(inputDir, "input_" + std::to_string(k) + ".pb")
                          : join(inputDir, v->name() + ".npy");
    if (!llvm::sys::fs::exists(path))
      return cleave::fail("input '" + v->name() + "': missing file '" + path +
                          "'");
    auto t = pb ? frontend::readTensorProtoFile(path)
                : runtime::readNpyFile(path);
    if (!t)
      return cleave::fail("input '" + v->name() +
                          "': " + llvm::toString(t.takeError()));
    if ((*t)->type() != v->type())
      return cleave::fail("input '" + v->name() + "': '" + path + "' holds " +
                          (*t)->type().str() + " but the graph needs " +
                          v->type().str());
    inputs.push_back(*t);
  }
  auto backend = runtime::createBackend(device, 0, 0);
  if (!backend)
    return backend.takeError();
  auto interp = interp::Interpreter::create(g, **backend);
  if (!interp)
    return interp.takeError();
  auto outputs = (*interp)->run(inputs);
  if (!outputs)
    return outputs.takeError();
  if (std::error_code ec = llvm::sys::fs::create_directories(outputDir))
    return cleave::fail("cannot create '" + outputDir + "': " + ec.message());
  for (size_t k = 0; k < outputs->size(); ++k) {
    const ir::Value *v = g.outputs()[k];
    std::string path = pb ? join(outputDir,
                                 "output_" + std::to_string(k) + ".pb")
                          : join(outputDir, v->name() + ".npy");
    llvm::Error e = pb ? frontend::writeTensorProtoFile(path, *(*outputs)[k],
                                                        v->name())
                       : runtime::writeNpyFile(path, *(*outputs)[k]);
    if (e)
      return e;
    log << "wrote " << path << " (" << v->name() << " "
        << v->type().str() << ")\n";
  }
  return llvm::Error::success();
}

} // namespace cleave::tools
