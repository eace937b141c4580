// Tests for the .cplan file (runtime/PlanFile.h): a round trip of a
// hand-built two-stage plan, per-stage loading, every way a file can be
// wrong (magic, version, truncation, corrupt blobs, corrupt headers), atomic
// writes, and the text printer.
#include "support/Checksum.h"
#include "runtime/PlanFile.h"

#include "TestSupport.h"

#include "llvm/Support/raw_ostream.h"

#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <random>

namespace unit_plan_file {

using namespace cleave;
using namespace cleave::runtime;
using cleave::testsupport::TempDir;

namespace {

Slot slot(std::string name, SlotKind kind, ir::DType dtype,
          std::vector<int64_t> shape, int64_t offset = -1, int blob = -1,
          int accum = -1, bool trainable = false) {
  Slot s;
  s.name = std::move(name);
  s.kind = kind;
  s.dtype = dtype;
  s.shape = std::move(shape);
  s.bytes = int64_t(ir::dtypeSize(dtype));
  for (int64_t d : s.shape)
    s.bytes *= d;
  s.offset = offset;
  s.blob = blob;
  s.accum = accum;
  s.trainable = trainable;
  return s;
}

Instr kernel(ir::OpKind op, std::vector<int> in, std::vector<int> out,
             std::string loc = "") {
  Instr i;
  i.kind = InstrKind::Kernel;
  i.op = op;
  i.inputs = std::move(in);
  i.outputs = std::move(out);
  i.loc = std::move(loc);
  return i;
}

Instr send(int slot, int peer, int64_t tag) {
  Instr i;
  i.kind = InstrKind::Send;
  i.inputs = {slot};
  i.peer = peer;
  i.tag = tag;
  return i;
}

Instr recv(int slot, int peer, int64_t tag) {
  Instr i;
  i.kind = InstrKind::Recv;
  i.outputs = {slot};
  i.peer = peer;
  i.tag = tag;
  return i;
}

Blob blob(size_t bytes, uint8_t seed) {
  Blob b;
  b.bytes.resize(bytes);
  for (size_t i = 0; i < bytes; ++i)
    b.bytes[i] = uint8_t(seed + i * 31 + (i >> 8));
  b.checksum = support::blockChecksum(b.bytes.data(), b.bytes.size());
  return b;
}

// Two stages, every slot kind, attribute kind and instruction kind. Stage
// 0's "big" parameter has `bigElems` f32 elements (its blob > 1 MiB by
// default).
Plan makePlan(int64_t bigElems = 300000) {
  using ir::DType;
  Plan p;
  p.modelName = "tiny";
  p.sourceModel = "models/tiny.onnx";
  p.schedule = "1f1b";
  p.microbatches = 2;
  p.inputs = {{"x", DType::F32, {2, 4}}, {"y", DType::I64, {2}}};
  p.optimizer = "adamw";
  p.lr = 0.001;
  p.predictedStepTime = 0.0125;
  p.blobs = {blob(64, 1), blob(16, 2), blob(size_t(bigElems) * 4, 3),
             blob(64, 4)};

  StagePlan s0;
  s0.index = 0;
  s0.slots = {
      slot("x", SlotKind::Input, DType::F32, {2, 4}),
      slot("w0", SlotKind::State, DType::F32, {4, 4}, -1, 0, -1, true),
      slot("c", SlotKind::Const, DType::I64, {2}, -1, 1),
      slot("h", SlotKind::MicroTemp, DType::F32, {2, 4}, 0),
      slot("dw0", SlotKind::MicroTemp, DType::F32, {4, 4}, 64, -1, 5),
      slot("dw0.sum", SlotKind::Accum, DType::F32, {4, 4}),
      slot("w0.new", SlotKind::StepTemp, DType::F32, {4, 4}, 0),
      slot("big", SlotKind::State, DType::F32, {bigElems}, -1, 2, -1, true),
      slot("dh", SlotKind::MicroTemp, DType::F32, {2, 4}, 128),
  };
  s0.frameBytes = 192;
  s0.stepFrameBytes = 64;
  Instr gemm = kernel(ir::OpKind::Gemm, {0, 1}, {3}, "/blocks.0/attn/MatMul");
  gemm.attrs.emplace("transA", int64_t(1));
  gemm.attrs.emplace("alpha", 0.5f);
  gemm.attrs.emplace("note", "hi \"there\"");
  gemm.attrs.emplace("perm", std::vector<int64_t>{1, 0});
  gemm.attrs.emplace("scales", std::vector<float>{1.5f, -2.0f});
  gemm.attrs.emplace("tags", std::vector<std::string>{"a", "b"});
  gemm.attrs.emplace("value",
                     ir::TensorData::fromDoubles(ir::DType::F32, {2}, {1, 2}));
  gemm.attrs.emplace("table",
                     ir::TensorData::fromInts(ir::DType::I64, {3, 4},
                                              std::vector<int64_t>(12, 7)));
  s0.programs[int(Phase::F)] = {gemm, send(3, 1, 7)};
  s0.programs[int(Phase::B)] = {recv(8, 1, 8)};
  s0.programs[int(Phase::W)] = {kernel(ir::OpKind::MatMul, {0, 8}, {4})};
  Instr update = kernel(ir::OpKind::Sub, {1, 5}, {6}, "opt/w0");
  update.seedSalt = 42;
  s0.programs[int(Phase::Step)] = {update};
  s0.stepUpdates = {{1, 6}};
  s0.actions = {{ActionKind::F, 0},    {ActionKind::F, 1}, {ActionKind::B, 0},
                {ActionKind::W, 0},    {ActionKind::B, 1}, {ActionKind::W, 1},
                {ActionKind::Step, -1}};
  s0.predictedF = 0.001;
  s0.predictedB = 0.002;
  s0.predictedW = 0.0015;
  s0.predictedPeakBytes = 1 << 20;

  StagePlan s1;
  s1.index = 1;
  s1.slots = {
      slot("h", SlotKind::MicroTemp, DType::F32, {2, 4}, 0),
      slot("w1", SlotKind::State, DType::F32, {4, 4}, -1, 3, -1, true),
      slot("out", SlotKind::MicroTemp, DType::F32, {2, 4}, 32),
      slot("loss", SlotKind::MicroTemp, DType::F32, {}, 64),
      slot("dh", SlotKind::MicroTemp, DType::F32, {2, 4}, 96),
      slot("running", SlotKind::State, DType::F32, {4}),
      slot("running.new", SlotKind::MicroTemp, DType::F32, {4}, 128),
  };
  s1.frameBytes = 144;
  s1.programs[int(Phase::F)] = {recv(0, 0, 7),
                                kernel(ir::OpKind::MatMul, {0, 1}, {2}),
                                kernel(ir::OpKind::Identity, {2}, {3}),
                                kernel(ir::OpKind::Identity, {5}, {6})};
  s1.programs[int(Phase::B)] = {kernel(ir::OpKind::Identity, {2}, {4}),
                                send(4, 0, 8)};
  s1.fwdUpdates = {{5, 6}};
  s1.actions = {{ActionKind::F, 0},
                {ActionKind::BW, 0},
                {ActionKind::F, 1},
                {ActionKind::BW, 1},
                {ActionKind::Step, -1}};
  s1.lossSlot = 3;
  s1.predictedF = 0.003;
  s1.predictedPeakBytes = 4096;

  p.stages = {std::move(s0), std::move(s1)};
  return p;
}

void expectAttrEq(const ir::Attribute &a, const ir::Attribute &b,
                  const std::string &name) {
  SCOPED_TRACE("attribute " + name);
  ASSERT_EQ(a.kind(), b.kind());
  switch (a.kind()) {
  case ir::AttrKind::Int:
    EXPECT_EQ(a.getInt(), b.getInt());
    break;
  case ir::AttrKind::Float:
    EXPECT_EQ(a.getFloat(), b.getFloat());
    break;
  case ir::AttrKind::String:
    EXPECT_EQ(a.getString(), b.getString());
    break;
  case ir::AttrKind::Ints:
    EXPECT_EQ(a.getInts(), b.getInts());
    break;
  case ir::AttrKind::Floats:
    EXPECT_EQ(a.getFloats(), b.getFloats());
    break;
  case ir::AttrKind::Strings:
    EXPECT_EQ(a.getStrings(), b.getStrings());
    break;
  case ir::AttrKind::Tensor:
    EXPECT_EQ(a.getTensor()->type(), b.getTensor()->type());
    EXPECT_EQ(a.getTensor()->bytes().vec(), b.getTensor()->bytes().vec());
    break;
  }
}

void expectPlansEqual(const Plan &a, const Plan &b) {
  EXPECT_EQ(a.version, b.version);
  EXPECT_EQ(a.modelName, b.modelName);
  EXPECT_EQ(a.sourceModel, b.sourceModel);
  EXPECT_EQ(a.schedule, b.schedule);
  EXPECT_EQ(a.microbatches, b.microbatches);
  ASSERT_EQ(a.inputs.size(), b.inputs.size());
  for (size_t i = 0; i < a.inputs.size(); ++i) {
    EXPECT_EQ(a.inputs[i].name, b.inputs[i].name);
    EXPECT_EQ(a.inputs[i].dtype, b.inputs[i].dtype);
    EXPECT_EQ(a.inputs[i].shape, b.inputs[i].shape);
  }
  EXPECT_EQ(a.optimizer, b.optimizer);
  EXPECT_EQ(a.lr, b.lr);
  EXPECT_EQ(a.predictedStepTime, b.predictedStepTime);
  ASSERT_EQ(a.blobs.size(), b.blobs.size());
  for (size_t i = 0; i < a.blobs.size(); ++i) {
    EXPECT_EQ(a.blobs[i].bytes, b.blobs[i].bytes) << "blob " << i;
    EXPECT_EQ(a.blobs[i].checksum, b.blobs[i].checksum) << "blob " << i;
  }
  ASSERT_EQ(a.stages.size(), b.stages.size());
  for (size_t si = 0; si < a.stages.size(); ++si) {
    SCOPED_TRACE("stage " + std::to_string(si));
    const StagePlan &x = a.stages[si], &y = b.stages[si];
    EXPECT_EQ(x.index, y.index);
    ASSERT_EQ(x.slots.size(), y.slots.size());
    for (size_t i = 0; i < x.slots.size(); ++i) {
      const Slot &p = x.slots[i], &q = y.slots[i];
      EXPECT_EQ(p.name, q.name);
      EXPECT_EQ(p.kind, q.kind);
      EXPECT_EQ(p.dtype, q.dtype);
      EXPECT_EQ(p.shape, q.shape);
      EXPECT_EQ(p.bytes, q.bytes);
      EXPECT_EQ(p.offset, q.offset);
      EXPECT_EQ(p.blob, q.blob);
      EXPECT_EQ(p.accum, q.accum);
      EXPECT_EQ(p.trainable, q.trainable);
    }
    for (int ph = 0; ph < kNumPhases; ++ph) {
      ASSERT_EQ(x.programs[ph].size(), y.programs[ph].size());
      for (size_t i = 0; i < x.programs[ph].size(); ++i) {
        const Instr &p = x.programs[ph][i], &q = y.programs[ph][i];
        EXPECT_EQ(p.kind, q.kind);
        EXPECT_EQ(p.op, q.op);
        EXPECT_EQ(p.inputs, q.inputs);
        EXPECT_EQ(p.outputs, q.outputs);
        EXPECT_EQ(p.peer, q.peer);
        EXPECT_EQ(p.tag, q.tag);
        EXPECT_EQ(p.seedSalt, q.seedSalt);
        EXPECT_EQ(p.loc, q.loc);
        ASSERT_EQ(p.attrs.size(), q.attrs.size());
        for (auto it = p.attrs.begin(), jt = q.attrs.begin();
             it != p.attrs.end(); ++it, ++jt) {
          EXPECT_EQ(it->first, jt->first);
          expectAttrEq(it->second, jt->second, it->first);
        }
      }
    }
    auto updatesEq = [](const std::vector<StateUpdate> &u,
                        const std::vector<StateUpdate> &v) {
      ASSERT_EQ(u.size(), v.size());
      for (size_t i = 0; i < u.size(); ++i) {
        EXPECT_EQ(u[i].state, v[i].state);
        EXPECT_EQ(u[i].value, v[i].value);
      }
    };
    updatesEq(x.fwdUpdates, y.fwdUpdates);
    updatesEq(x.stepUpdates, y.stepUpdates);
    ASSERT_EQ(x.actions.size(), y.actions.size());
    for (size_t i = 0; i < x.actions.size(); ++i) {
      EXPECT_EQ(x.actions[i].kind, y.actions[i].kind);
      EXPECT_EQ(x.actions[i].microbatch, y.actions[i].microbatch);
    }
    EXPECT_EQ(x.frameBytes, y.frameBytes);
    EXPECT_EQ(x.stepFrameBytes, y.stepFrameBytes);
    EXPECT_EQ(x.lossSlot, y.lossSlot);
    EXPECT_EQ(x.predictedF, y.predictedF);
    EXPECT_EQ(x.predictedB, y.predictedB);
    EXPECT_EQ(x.predictedW, y.predictedW);
    EXPECT_EQ(x.predictedPeakBytes, y.predictedPeakBytes);
  }
}

std::string readBytes(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void writeBytes(const std::string &path, const std::string &bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), std::streamsize(bytes.size()));
}

// The error message of a read that must fail.
std::string readError(const std::string &path,
                      std::optional<int> onlyStage = std::nullopt) {
  llvm::Expected<Plan> p = readPlanFile(path, onlyStage);
  if (p)
    return "(read succeeded)";
  return llvm::toString(p.takeError());
}

std::string errorText(llvm::Error e) {
  return e ? llvm::toString(std::move(e)) : "(success)";
}

uint64_t headerLength(const std::string &file) {
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i)
    n = (n << 8) | uint8_t(file[15 + i]);
  return n;
}

std::string printed(const Plan &p) {
  std::string s;
  llvm::raw_string_ostream os(s);
  printPlan(p, os);
  return os.str();
}

} // namespace

TEST(PlanFile, RoundTrip) {
  TempDir dir;
  std::string path = dir.file("tiny.cplan");
  Plan plan = makePlan();
  ASSERT_GT(plan.blobs[2].bytes.size(), size_t(1) << 20);
  ASSERT_EQ(errorText(writePlanFile(plan, path)), "(success)");
  llvm::Expected<Plan> back = readPlanFile(path);
  ASSERT_TRUE(bool(back)) << llvm::toString(back.takeError());
  expectPlansEqual(plan, *back);
  // Only the plan file is left behind.
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"tiny.cplan"});
}

TEST(PlanFile, LayoutIsAlignedAndDeterministic) {
  TempDir dir;
  Plan plan = makePlan();
  ASSERT_EQ(errorText(writePlanFile(plan, dir.file("a.cplan"))), "(success)");
  ASSERT_EQ(errorText(writePlanFile(plan, dir.file("b.cplan"))), "(success)");
  std::string a = readBytes(dir.file("a.cplan"));
  EXPECT_EQ(a, readBytes(dir.file("b.cplan")));
  EXPECT_EQ(a.substr(0, 11), std::string("CLEAVEPLAN\0", 11));
  EXPECT_EQ(a.substr(11, 4), std::string("\3\0\0\0", 4));
  EXPECT_EQ(a.size() % 64, 0u);
  // The first blob starts at the first 64-byte boundary after the header,
  // and its bytes are there verbatim.
  uint64_t first = (23 + headerLength(a) + 63) / 64 * 64;
  EXPECT_EQ(a.substr(first, 64), std::string(plan.blobs[0].bytes.begin(),
                                             plan.blobs[0].bytes.end()));
  // The big blob is stored whole, outside the header.
  EXPECT_LT(headerLength(a), 4096u);
  EXPECT_GT(a.size(), plan.blobs[2].bytes.size());
}

TEST(PlanFile, OverwritesAnExistingFile) {
  TempDir dir;
  std::string path = dir.file("p.cplan");
  writeBytes(path, "old contents");
  Plan plan = makePlan(16);
  ASSERT_EQ(errorText(writePlanFile(plan, path)), "(success)");
  llvm::Expected<Plan> back = readPlanFile(path);
  ASSERT_TRUE(bool(back)) << llvm::toString(back.takeError());
  expectPlansEqual(plan, *back);
}

TEST(PlanFile, OnlyStageLoadsThatStagesBlobs) {
  TempDir dir;
  std::string path = dir.file("tiny.cplan");
  Plan plan = makePlan();
  ASSERT_EQ(errorText(writePlanFile(plan, path)), "(success)");

  llvm::Expected<Plan> s1 = readPlanFile(path, 1);
  ASSERT_TRUE(bool(s1)) << llvm::toString(s1.takeError());
  ASSERT_EQ(s1->blobs.size(), 4u);
  for (int b : {0, 1, 2})
    EXPECT_TRUE(s1->blobs[b].bytes.empty()) << "blob " << b;
  EXPECT_EQ(s1->blobs[3].bytes, plan.blobs[3].bytes);
  for (size_t b = 0; b < 4; ++b)
    EXPECT_EQ(s1->blobs[b].checksum, plan.blobs[b].checksum) << "blob " << b;
  EXPECT_EQ(s1->stages.size(), 2u); // the whole header is there

  llvm::Expected<Plan> s0 = readPlanFile(path, 0);
  ASSERT_TRUE(bool(s0)) << llvm::toString(s0.takeError());
  for (int b : {0, 1, 2})
    EXPECT_EQ(s0->blobs[b].bytes, plan.blobs[b].bytes) << "blob " << b;
  EXPECT_TRUE(s0->blobs[3].bytes.empty());

  EXPECT_EQ(readError(path, 2), path + ": no stage 2 (the plan has 2 stages)");
}

TEST(PlanFile, WrongMagic) {
  TempDir dir;
  std::string path = dir.file("x.cplan");
  for (std::string bytes :
       {std::string(), std::string("CLEAVE"),
        std::string("CLEAVEPLAX\0\1\0\0\0", 15),
        std::string("PK\3\4 this is a zip file, not a plan......")}) {
    writeBytes(path, bytes);
    EXPECT_EQ(readError(path), path + ": not a cleave plan");
  }
  EXPECT_EQ(readError(dir.file("missing.cplan")),
            "cannot open '" + dir.file("missing.cplan") +
                "': No such file or directory");
}

TEST(PlanFile, WrongVersion) {
  TempDir dir;
  std::string path = dir.file("v.cplan");
  ASSERT_EQ(errorText(writePlanFile(makePlan(16), path)), "(success)");
  std::string bytes = readBytes(path);
  bytes[11] = 4;
  writeBytes(path, bytes);
  EXPECT_EQ(readError(path),
            path + ": plan format version 4; this cleave reads version 3: "
                   "recompile the model with this cleavec");
}

TEST(PlanFile, Truncated) {
  TempDir dir;
  std::string good = dir.file("good.cplan"), path = dir.file("cut.cplan");
  Plan plan = makePlan();
  ASSERT_EQ(errorText(writePlanFile(plan, good)), "(success)");
  std::string bytes = readBytes(good);
  uint64_t header = headerLength(bytes);
  uint64_t blobs = (23 + header + 63) / 64 * 64;
  std::vector<size_t> cuts = {
      15,                               // in the preamble
      23,                               // right after it
      size_t(23 + header / 2),          // in the header
      size_t(23 + header - 1),          // one byte short of the header
      size_t(blobs + 64 + 64 + 1000),   // in the big blob
      size_t(blobs + 64 + 64 + 600000), // in the big blob, further on
      bytes.size() - 1,                 // in the last blob
  };
  for (size_t cut : cuts) {
    SCOPED_TRACE("cut at " + std::to_string(cut));
    writeBytes(path, bytes.substr(0, cut));
    std::string err = readError(path);
    EXPECT_EQ(err.rfind(path + ": truncated", 0), 0u) << err;
    EXPECT_EQ(err.find('\n'), std::string::npos) << err;
  }
  // A blob-level cut names the blob's slot.
  writeBytes(path, bytes.substr(0, blobs + 64 + 64 + 1000));
  EXPECT_NE(readError(path).find("blob of slot 'big' (stage 0)"),
            std::string::npos)
      << readError(path);
}

TEST(PlanFile, CorruptBlobNamesItsSlot) {
  TempDir dir;
  std::string path = dir.file("c.cplan");
  Plan plan = makePlan();
  ASSERT_EQ(errorText(writePlanFile(plan, path)), "(success)");
  std::string bytes = readBytes(path);
  uint64_t blobs = (23 + headerLength(bytes) + 63) / 64 * 64;
  bytes[blobs + 64 + 64 + 12345] ^= 0x10; // inside "big", stage 0
  writeBytes(path, bytes);
  EXPECT_EQ(readError(path),
            path + ": blob of slot 'big' (stage 0) is corrupt: checksum "
                   "mismatch");
  EXPECT_EQ(readError(path, 0),
            path + ": blob of slot 'big' (stage 0) is corrupt: checksum "
                   "mismatch");
  // Stage 1 never reads that blob.
  EXPECT_EQ(readError(path, 1), "(read succeeded)");
}

TEST(PlanFile, CorruptHeaderGivesAnErrorNotACrash) {
  TempDir dir;
  std::string path = dir.file("bad.cplan");
  ASSERT_EQ(errorText(writePlanFile(makePlan(4), path)), "(success)");
  const std::string bytes = readBytes(path);
  uint64_t header = headerLength(bytes);
  int errors = 0, reads = 0;
  // Damages the file in place at `positions` (cheaper than rewriting it),
  // reads it, and puts the bytes back.
  std::fstream file(path, std::ios::in | std::ios::out | std::ios::binary);
  auto check = [&](const std::vector<std::pair<uint64_t, char>> &damage,
                   const std::string &what) {
    for (auto [pos, c] : damage) {
      file.seekp(std::streamoff(pos));
      file.put(c);
    }
    file.flush();
    llvm::Expected<Plan> p = readPlanFile(path);
    for (auto [pos, c] : damage) {
      file.seekp(std::streamoff(pos));
      file.put(bytes[pos]);
    }
    file.flush();
    ++reads;
    if (p)
      return; // a flip in a name or a float can leave a valid plan
    ++errors;
    std::string err = llvm::toString(p.takeError());
    EXPECT_EQ(err.rfind(path + ": ", 0), 0u) << what << ": " << err;
    EXPECT_EQ(err.find('\n'), std::string::npos) << what << ": " << err;
  };
  // Every byte of the preamble's length field and of the header, flipped
  // two ways.
  for (uint64_t pos = 15; pos < 23 + header; ++pos)
    for (uint8_t mask : {uint8_t(0xff), uint8_t(0x01)})
      check({{pos, char(bytes[pos] ^ mask)}},
            "byte " + std::to_string(pos) + " ^ " + std::to_string(mask));
  // Random bursts of damage.
  std::mt19937 rng(1234);
  for (int i = 0; i < 300; ++i) {
    std::vector<std::pair<uint64_t, char>> damage;
    for (int k = 0; k < 4; ++k)
      damage.push_back({23 + rng() % header, char(rng())});
    check(damage, "burst " + std::to_string(i));
  }
  // The file is whole again.
  file.close();
  EXPECT_EQ(readError(path), "(read succeeded)");
  EXPECT_GT(errors, reads / 4);
}

TEST(PlanFile, InvalidNamesInTheHeader) {
  TempDir dir;
  std::string good = dir.file("good.cplan"), path = dir.file("bad.cplan");
  ASSERT_EQ(errorText(writePlanFile(makePlan(4), good)), "(success)");
  std::string bytes = readBytes(good);
  auto patched = [&](const std::string &from, const std::string &to) {
    std::string c = bytes;
    size_t at = c.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    c.replace(at, from.size(), to);
    writeBytes(path, c);
    return readError(path);
  };
  EXPECT_EQ(patched("Gemm", "Gexm"),
            path + ": invalid plan: stage 0 F instr 0: unknown op 'Gexm'");
  EXPECT_EQ(patched("i64", "q64"),
            path + ": invalid plan: input 'y' has unknown dtype 'q64'");
}

TEST(PlanFile, VerifyPlanCatchesBadIndices) {
  auto err = [](auto edit) {
    Plan p = makePlan(4);
    edit(p);
    return errorText(verifyPlan(p));
  };
  EXPECT_EQ(err([](Plan &) {}), "(success)");
  EXPECT_EQ(err([](Plan &p) { p.stages[0].programs[0][0].inputs[1] = 99; }),
            "invalid plan: stage 0 F instr 0 (/blocks.0/attn/MatMul): input "
            "slot 99 out of range (the stage has 9 slots)");
  EXPECT_EQ(err([](Plan &p) { p.stages[0].programs[0][1].peer = 0; }),
            "invalid plan: stage 0 F instr 1: bad peer stage 0");
  EXPECT_EQ(err([](Plan &p) { p.stages[1].slots[1].blob = 7; }),
            "invalid plan: stage 1 slot 1 'w1': blob 7 out of range (4 blobs)");
  EXPECT_EQ(err([](Plan &p) { p.stages[1].slots[1].bytes = 60; }),
            "invalid plan: stage 1 slot 1 'w1': 60 bytes for f32[4,4]");
  EXPECT_EQ(err([](Plan &p) { p.stages[0].slots[8].offset = 161; }),
            "invalid plan: stage 0 slot 8 'dh': offset 161 + 32 bytes is "
            "outside its frame (192 bytes)");
  EXPECT_EQ(err([](Plan &p) { p.blobs[3].bytes.pop_back(); }),
            "invalid plan: stage 1 slot 1 'w1': its blob 3 has 63 bytes, not "
            "64");
  EXPECT_EQ(err([](Plan &p) { p.stages[1].actions[0].microbatch = 2; }),
            "invalid plan: stage 1: action F of microbatch 2");
  EXPECT_EQ(err([](Plan &p) {
              p.stages[0].programs[0][0].attrs.erase("transA");
              p.stages[0].programs[0][0].attrs.emplace("transA", 1.0f);
            }),
            "invalid plan: stage 0 F instr 0 (/blocks.0/attn/MatMul): Gemm: "
            "attribute 'transA' must be of kind i, not f");
  EXPECT_EQ(err([](Plan &p) { p.stages[1].fwdUpdates[0].state = 6; }),
            "invalid plan: stage 1: forward update of slot 'running.new', "
            "which is not state");
}

TEST(PlanFile, UnwritablePathLeavesNoFile) {
  TempDir dir;
  Plan plan = makePlan(16);
  // No such folder.
  std::string missing = dir.file("no/such/dir/p.cplan");
  std::string err = errorText(writePlanFile(plan, missing));
  EXPECT_EQ(err.rfind(missing + ": cannot create", 0), 0u) << err;
  EXPECT_TRUE(dir.entries().empty());
  // A folder at the path is refused before a temp file is written.
  std::string folder = dir.file("taken");
  ASSERT_FALSE(llvm::sys::fs::create_directory(folder));
  err = errorText(writePlanFile(plan, folder));
  EXPECT_EQ(err, "cannot write '" + folder +
                     "': it is a directory, not a regular file or a new path");
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"taken"});
  // An invalid plan is refused before anything is written.
  plan.stages[0].lossSlot = 42;
  err = errorText(writePlanFile(plan, dir.file("p.cplan")));
  EXPECT_EQ(err, dir.file("p.cplan") +
                     ": invalid plan: stage 0: loss slot 42 out of range");
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"taken"});
}

TEST(PlanFile, PrintPlan) {
  Plan plan = makePlan(4);
  std::string text = printed(plan);
  EXPECT_EQ(text, printed(plan)); // deterministic
  for (const char *line : {
           "plan \"tiny\" (format version 3)\n",
           "  source \"models/tiny.onnx\"\n",
           "  schedule 1f1b, 2 stages, 2 microbatches\n",
           "  input \"x\" : f32[2,4]\n",
           "  input \"y\" : i64[2]\n",
           "  optimizer adamw, lr 0.001, precision f32\n",
           "  predicted step time 12.500 ms\n",
           "\nstage 0\n",
           "    %0 input \"x\" f32[2,4] 32 B\n",
           "    %1 state \"w0\" f32[4,4] 64 B blob 0 trainable\n",
           "    %2 const \"c\" i64[2] 16 B blob 1\n",
           "    %4 micro \"dw0\" f32[4,4] 64 B @64 accum %5\n",
           "    %5 accum \"dw0.sum\" f32[4,4] 64 B\n",
           "    %6 step \"w0.new\" f32[4,4] 64 B @0\n",
           "  frame 192 B, step frame 64 B\n",
           "  program F (2 instrs)\n",
           "    %3 = Gemm(%0, %1) {alpha = 0.5, note = \"hi \\\"there\\\"\", "
           "perm = [1, 0], scales = [1.5, -2.0], table = i64[3,4] <96 bytes>, "
           "tags = [\"a\", \"b\"], transA = 1, value = f32[2] [1.0, 2.0]} "
           "@\"/blocks.0/attn/MatMul\"\n",
           "    send %3 -> stage 1 tag 7\n",
           "    %8 = recv <- stage 1 tag 8\n",
           "    %4 = MatMul(%0, %8)\n",
           "    %6 = Sub(%1, %5) seed 42 @\"opt/w0\"\n",
           "  step updates: %1 <- %6\n",
           "  actions: F0 F1 B0 W0 B1 W1 STEP\n",
           "  predicted: F 1.000 ms, B 2.000 ms, W 1.500 ms, peak 1048576 B\n",
           "\nstage 1\n",
           "  loss %3\n",
           "    %0 = recv <- stage 0 tag 7\n",
           "  forward updates: %5 <- %6\n",
           "  actions: F0 BW0 F1 BW1 STEP\n",
       })
    EXPECT_NE(text.find(line), std::string::npos)
        << "missing: " << line << "in:\n"
        << text;
}

TEST(PlanFile, PrintAfterRoundTripIsTheSame) {
  TempDir dir;
  Plan plan = makePlan(16);
  ASSERT_EQ(errorText(writePlanFile(plan, dir.file("p.cplan"))), "(success)");
  llvm::Expected<Plan> back = readPlanFile(dir.file("p.cplan"));
  ASSERT_TRUE(bool(back)) << llvm::toString(back.takeError());
  EXPECT_EQ(printed(plan), printed(*back));
}

} // namespace unit_plan_file
