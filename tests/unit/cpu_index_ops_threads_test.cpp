// ScatterElements (and its gradients), CumSum, Resize (and ResizeGrad) and
// Tile give the same bits on 1, 2 and 4 threads, at shapes of the models
// that use them: label shifting over a batch of sequences, position ids
// from an attention mask, a segmentation head's bilinear upsampling.
#include "CpuKernelTesting.h"

#include "runtime/Kernel.h"

#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <string>

namespace unit_cpu_index_ops_threads {

using namespace cleave;
using namespace cleave::testsupport::typed;
using ir::OpKind;

namespace {

struct Case {
  std::string name;
  OpKind op;
  ir::AttrMap attrs;
  std::vector<TensorRef> inputs;
  Ints out;
};

std::vector<float> runCase(const Case &c) {
  Host<float> y(c.out);
  std::fill(y.data.begin(), y.data.end(), -7.0f);
  if (llvm::Error e = run(c.op, c.attrs, c.inputs, {y.ref()}))
    ADD_FAILURE() << c.name << ": " << llvm::toString(std::move(e));
  return y.data;
}

TEST(CpuIndexOpsThreads, SameBitsOnOneTwoAndFourThreads) {
  Host<float> x = randomHost<float>({16, 256}, 1);
  Host<float> upd = randomHost<float>({16, 256}, 2);
  Host<int64_t> idx({16, 256});
  for (size_t i = 0; i < idx.data.size(); ++i) // repeats within each row
    idx.data[i] = int64_t((i * 7919) % 97) - 40;
  Host<float> img = randomHost<float>({4, 21, 8, 8}, 3);
  Host<float> dUp = randomHost<float>({4, 21, 32, 32}, 4);
  Host<float> dOdd = randomHost<float>({4, 21, 19, 27}, 5);
  auto resize = [](const char *mode, const char *coord, Ints sizes) {
    return ir::AttrMap{{"mode", std::string(mode)},
                       {"coordinate_transformation_mode", std::string(coord)},
                       {"nearest_mode", std::string("floor")},
                       {"sizes", sizes}};
  };
  auto grad = [&](const char *mode, const char *coord) {
    ir::AttrMap a = resize(mode, coord, {});
    a.erase("sizes");
    a.emplace("shape", Ints{4, 21, 8, 8});
    return a;
  };
  std::vector<Case> cases = {
      {"ScatterElements add", OpKind::ScatterElements,
       {{"axis", int64_t(1)}, {"reduction", std::string("add")}},
       {x.ref(), idx.ref(), upd.ref()}, x.shape},
      {"ScatterElements none", OpKind::ScatterElements,
       {{"axis", int64_t(1)}}, {x.ref(), idx.ref(), upd.ref()}, x.shape},
      {"ScatterElementsGradData", OpKind::ScatterElementsGradData,
       {{"axis", int64_t(1)}}, {x.ref(), idx.ref()}, x.shape},
      {"ScatterElementsGradUpdates", OpKind::ScatterElementsGradUpdates,
       {{"axis", int64_t(1)}}, {x.ref(), idx.ref()}, x.shape},
      {"CumSum axis 1", OpKind::CumSum, {{"axis", int64_t(1)}}, {x.ref()},
       x.shape},
      {"CumSum axis 0 reverse exclusive", OpKind::CumSum,
       {{"axis", int64_t(0)}, {"reverse", int64_t(1)},
        {"exclusive", int64_t(1)}},
       {x.ref()}, x.shape},
      {"Resize bilinear x4", OpKind::Resize,
       resize("linear", "half_pixel", {4, 21, 32, 32}), {img.ref()},
       {4, 21, 32, 32}},
      {"Resize bilinear align_corners 19x27", OpKind::Resize,
       resize("linear", "align_corners", {4, 21, 19, 27}), {img.ref()},
       {4, 21, 19, 27}},
      {"Resize nearest x4", OpKind::Resize,
       resize("nearest", "asymmetric", {4, 21, 32, 32}), {img.ref()},
       {4, 21, 32, 32}},
      {"ResizeGrad bilinear", OpKind::ResizeGrad,
       grad("linear", "half_pixel"), {dUp.ref()}, {4, 21, 8, 8}},
      {"ResizeGrad bilinear align_corners", OpKind::ResizeGrad,
       grad("linear", "align_corners"), {dOdd.ref()}, {4, 21, 8, 8}},
      {"ResizeGrad nearest", OpKind::ResizeGrad,
       grad("nearest", "asymmetric"), {dUp.ref()}, {4, 21, 8, 8}},
      {"Tile", OpKind::Tile, {{"repeats", Ints{3, 1, 2, 4}}}, {img.ref()},
       {12, 21, 16, 32}},
  };
  testsupport::cpu(); // first, so it does not reset the pool below
  std::vector<std::vector<std::vector<float>>> results;
  for (int threads : {1, 2, 4}) {
    auto backend = runtime::createCpuBackend(threads);
    std::vector<std::vector<float>> r;
    for (const Case &c : cases)
      r.push_back(runCase(c));
    results.push_back(std::move(r));
  }
  auto restore = runtime::createCpuBackend(2); // the other tests' 2 threads
  for (size_t t = 1; t < results.size(); ++t)
    for (size_t k = 0; k < cases.size(); ++k)
      EXPECT_EQ(std::memcmp(results[0][k].data(), results[t][k].data(),
                            results[0][k].size() * sizeof(float)),
                0)
          << cases[k].name << " on " << (t == 1 ? 2 : 4) << " threads";
}

} // namespace

} // namespace unit_cpu_index_ops_threads
