// writeTrainedOnnx: new initializer values written into a copy of a committed
// model and read back through the importer; models with external data, the
// side-file layout of large models, and the one-line errors that leave no
// file behind.
#include "frontend/OnnxImporter.h"
#include "frontend/TrainedModel.h"
#include "TestSupport.h"

#include "llvm/Support/FileSystem.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/raw_ostream.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>

namespace unit_trained_model {

using namespace cleave;
using namespace cleave::ir;
using ::testing::HasSubstr;

namespace {

using Values = std::map<std::string, std::shared_ptr<TensorData>>;
using Bytes = std::vector<uint8_t>;

const char *kMlp = "tests/models/training/mlp/model.onnx";
const char *kGptExt = "tests/models/gpt_tiny_ext/model.onnx";

std::string sourcePath(const std::string &rel) {
  return std::string(CLEAVE_SOURCE_DIR) + "/" + rel;
}

// name -> bytes of every declared tensor with data (params, buffers,
// constants) of the imported model.
std::map<std::string, Bytes> importedData(const std::string &path) {
  frontend::ImportOptions opts;
  opts.microbatchSize = 4;
  auto g = frontend::importOnnxFile(path, opts);
  if (!g) {
    ADD_FAILURE() << llvm::toString(g.takeError());
    return {};
  }
  std::map<std::string, Bytes> out;
  for (Value *v : (*g)->declared())
    if (v->data()) {
      if (llvm::Error e = v->data()->load()) {
        ADD_FAILURE() << v->name() << ": " << llvm::toString(std::move(e));
        continue;
      }
      llvm::ArrayRef<uint8_t> b = v->data()->bytes();
      out[v->name()] = Bytes(b.begin(), b.end());
    }
  return out;
}

// A tensor of `type` with element i = offset + i * 0.125.
std::shared_ptr<TensorData> ramp(TensorType type, double offset) {
  std::vector<double> v(type.numElements());
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = offset + double(i) * 0.125;
  return TensorData::fromDoubles(type.dtype, type.shape, v);
}

Bytes bytesOf(const TensorData &t) {
  return Bytes(t.bytes().begin(), t.bytes().end());
}

std::string writeError(const std::string &source, const Values &values,
                       const std::string &out) {
  llvm::Error e = frontend::writeTrainedOnnx(source, values, out);
  return e ? llvm::toString(std::move(e)) : "";
}

// Writes `values` into a copy of `sourceRel` and checks, through the
// importer, that exactly those tensors changed.
void expectRoundTrip(const std::string &sourceRel, const Values &values,
                     const std::string &out, uint64_t maxInline =
                                                 frontend::kMaxInlineOnnxBytes) {
  llvm::Error e = frontend::writeTrainedOnnx(sourcePath(sourceRel), values, out,
                                             maxInline);
  ASSERT_FALSE(bool(e)) << llvm::toString(std::move(e));
  std::map<std::string, Bytes> before = importedData(sourcePath(sourceRel));
  std::map<std::string, Bytes> after = importedData(out);
  ASSERT_FALSE(before.empty());
  ASSERT_EQ(before.size(), after.size());
  for (const auto &[name, bytes] : before) {
    ASSERT_TRUE(after.count(name)) << name;
    auto it = values.find(name);
    if (it != values.end())
      EXPECT_EQ(after[name], bytesOf(*it->second)) << name;
    else
      EXPECT_EQ(after[name], bytes) << name;
  }
  for (const auto &kv : values)
    EXPECT_NE(before[kv.first], after[kv.first]) << "unchanged " << kv.first;
}

Values mlpValues() {
  return {{"net.0.bias", ramp(TensorType(DType::F32, {24}), -1.0)},
          {"net.8.weight", ramp(TensorType(DType::F32, {10, 24}), 2.0)}};
}

} // namespace

TEST(TrainedModel, ReplacesInitializers) {
  testsupport::TempDir dir;
  expectRoundTrip(kMlp, mlpValues(), dir.file("trained.onnx"));
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"trained.onnx"});
}

TEST(TrainedModel, NoValuesCopiesTheModel) {
  testsupport::TempDir dir;
  expectRoundTrip(kMlp, {}, dir.file("copy.onnx"));
}

TEST(TrainedModel, OverwritesInPlace) {
  testsupport::TempDir dir;
  std::string path = dir.file("model.onnx");
  ASSERT_FALSE(llvm::sys::fs::copy_file(sourcePath(kMlp), path));
  Values v = mlpValues();
  ASSERT_FALSE(bool(frontend::writeTrainedOnnx(path, v, path)));
  std::map<std::string, Bytes> after = importedData(path);
  EXPECT_EQ(after["net.0.bias"], bytesOf(*v["net.0.bias"]));
  EXPECT_EQ(after["net.8.weight"], bytesOf(*v["net.8.weight"]));
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"model.onnx"});
}

// The source keeps its weights in model.onnx.data: the copy, written to
// another folder, holds every tensor inline and stands alone.
TEST(TrainedModel, ExternalDataSource) {
  testsupport::TempDir dir;
  Values v = {{"wte.weight", ramp(TensorType(DType::F32, {256, 32}), 0.5)},
              {"blocks.0.ln_1.bias", ramp(TensorType(DType::F32, {32}), -3)}};
  expectRoundTrip(kGptExt, v, dir.file("trained.onnx"));
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"trained.onnx"});
}

// Above the inline limit (lowered here from 2 GiB), initializers of 1 KiB or
// more go to `<out>.data`, found by the importer next to the model.
TEST(TrainedModel, LargeModelUsesSideFile) {
  testsupport::TempDir dir;
  expectRoundTrip(kMlp, mlpValues(), dir.file("big.onnx"), 1000);
  EXPECT_EQ(dir.entries(),
            (std::vector<std::string>{"big.onnx", "big.onnx.data"}));
  uint64_t size = 0;
  ASSERT_FALSE(llvm::sys::fs::file_size(dir.file("big.onnx.data"), size));
  // The weights of 24x16 and 3 x 24x24 floats; the 10x24 one (960 bytes)
  // and the biases stay inline.
  EXPECT_EQ(size, (24u * 16 + 3 * 24 * 24) * 4);
  uint64_t modelSize = 0;
  ASSERT_FALSE(llvm::sys::fs::file_size(dir.file("big.onnx"), modelSize));
  EXPECT_LT(modelSize, size);
}

TEST(TrainedModel, UnknownName) {
  testsupport::TempDir dir;
  Values v = mlpValues();
  v["net.9.weight"] = ramp(TensorType(DType::F32, {2}), 0);
  std::string msg = writeError(sourcePath(kMlp), v, dir.file("out.onnx"));
  EXPECT_THAT(msg, HasSubstr("has no initializer named 'net.9.weight'"));
  EXPECT_THAT(msg, HasSubstr("model.onnx'"));
  // A graph input is not an initializer either.
  msg = writeError(sourcePath(kMlp),
                   {{"x", ramp(TensorType(DType::F32, {8, 16}), 0)}},
                   dir.file("out.onnx"));
  EXPECT_THAT(msg, HasSubstr("has no initializer named 'x'"));
  EXPECT_TRUE(dir.entries().empty());
}

TEST(TrainedModel, WrongShapeOrDtype) {
  testsupport::TempDir dir;
  Values v = {{"net.0.weight", ramp(TensorType(DType::F32, {16, 24}), 0)}};
  std::string msg = writeError(sourcePath(kMlp), v, dir.file("out.onnx"));
  EXPECT_THAT(msg, HasSubstr("initializer 'net.0.weight'"));
  EXPECT_THAT(msg, HasSubstr("is " + TensorType(DType::F32, {24, 16}).str() +
                             ", but its new value is " +
                             TensorType(DType::F32, {16, 24}).str()));
  v = {{"net.0.bias", ramp(TensorType(DType::F64, {24}), 0)}};
  msg = writeError(sourcePath(kMlp), v, dir.file("out.onnx"));
  EXPECT_THAT(msg, HasSubstr("but its new value is " +
                             TensorType(DType::F64, {24}).str()));
  EXPECT_EQ(msg.find('\n'), std::string::npos);
  EXPECT_TRUE(dir.entries().empty());
}

TEST(TrainedModel, UnwritablePathLeavesNothing) {
  testsupport::TempDir dir;
  // The folder does not exist.
  std::string msg =
      writeError(sourcePath(kMlp), mlpValues(), dir.file("no/such/out.onnx"));
  EXPECT_THAT(msg, HasSubstr("cannot write '" + dir.file("no/such/out.onnx")));
  EXPECT_TRUE(dir.entries().empty());
  // The target is a folder: the temporary file is written, the rename fails
  // and the temporary file is removed. Same with the side file.
  ASSERT_FALSE(llvm::sys::fs::create_directory(dir.file("taken.onnx")));
  msg = writeError(sourcePath(kMlp), mlpValues(), dir.file("taken.onnx"));
  EXPECT_THAT(msg, HasSubstr("cannot write '" + dir.file("taken.onnx") + "'"));
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"taken.onnx"});
  llvm::Error e = frontend::writeTrainedOnnx(sourcePath(kMlp), mlpValues(),
                                             dir.file("taken.onnx"), 1000);
  EXPECT_THAT(llvm::toString(std::move(e)), HasSubstr("cannot write"));
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"taken.onnx"});
}

TEST(TrainedModel, BadSource) {
  testsupport::TempDir dir;
  EXPECT_THAT(writeError(dir.file("missing.onnx"), {}, dir.file("out.onnx")),
              HasSubstr("cannot open '" + dir.file("missing.onnx") + "'"));
  {
    std::error_code ec;
    llvm::raw_fd_ostream os(dir.file("junk.onnx"), ec);
    os << "this is not a protobuf \xff\xff\xff";
  }
  EXPECT_THAT(writeError(dir.file("junk.onnx"), {}, dir.file("out.onnx")),
              HasSubstr("is not a valid ONNX model"));
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"junk.onnx"});
}

} // namespace unit_trained_model
