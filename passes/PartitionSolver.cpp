// The exact chain partitioner (Partition.h): the table of candidate stage
// costs and the search over cut points. Knows nothing of graphs, so the
// tests can check it against brute force on random chains.
#include "passes/Partition.h"

#include "llvm/Support/FormatVariadic.h"

#include <algorithm>
#include <limits>

namespace cleave::passes {

static constexpr double kInf = std::numeric_limits<double>::infinity();

StageCostTable::StageCostTable(const LayerChain &chain, const LinkModel &link)
    : n_(int(chain.layers.size())) {
  fSum_.assign(n_ + 1, 0);
  bSum_.assign(n_ + 1, 0);
  wSum_.assign(n_ + 1, 0);
  stepSum_.assign(n_ + 1, 0);
  paramSum_.assign(n_ + 1, 0);
  staticSum_.assign(n_ + 1, 0);
  for (int i = 0; i < n_; ++i) {
    const LayerCost &c = chain.layers[i];
    fSum_[i + 1] = fSum_[i] + c.f;
    bSum_[i + 1] = bSum_[i] + c.b;
    wSum_[i + 1] = wSum_[i] + c.w;
    stepSum_[i + 1] = stepSum_[i] + c.step;
    paramSum_[i + 1] = paramSum_[i] + c.paramBytes;
    staticSum_[i + 1] = staticSum_[i] + c.staticBytes;
  }
  fillActivationAndTraffic(chain, link);
  frame_ = chain.frameBytes;
  stepFrame_ = chain.stepFrameBytes;
}

double StageCostTable::time(int first, int end) const {
  return f(first, end) + b(first, end) + w(first, end) + commTime(first, end);
}

int64_t StageCostTable::paramBytes(int first, int end) const {
  return paramSum_[end] - paramSum_[first];
}

int64_t StageCostTable::staticBytes(int first, int end) const {
  return staticSum_[end] - staticSum_[first] + replica_[at(first, end)] +
         (stepFrame_.empty() ? 0 : stepFrame_[at(first, end)]);
}

// For each first layer i, every value's contribution is a run of stage ends
// j, so each row is filled from difference arrays:
//   held: a stage [i, j) keeps v when it has a holder, i.e. from
//         j = (first holder >= i) + 1 on;
//   recv: it receives v (made before i) when it has a reader, from
//         j = (first reader >= i) + 1 on;
//   send: it sends v (made at p >= i) while a reader lies beyond it, for
//         j in [p + 1, last reader], and gets v's gradient back then.
void StageCostTable::fillActivationAndTraffic(const LayerChain &chain,
                                              const LinkModel &link) {
  size_t cells = size_t(n_) * n_;
  held_.assign(cells, 0);
  recv_.assign(cells, 0);
  send_.assign(cells, 0);
  replica_.assign(cells, 0);
  comm_.assign(cells, 0);
  fSends_.assign(cells, 0);
  bSends_.assign(cells, 0);
  auto firstAtOrAfter = [](const std::vector<int> &layers, int i) {
    auto it = std::lower_bound(layers.begin(), layers.end(), i);
    return it == layers.end() ? -1 : *it;
  };
  std::vector<int64_t> held(n_ + 2), recv(n_ + 2), send(n_ + 2),
      replica(n_ + 2), fSends(n_ + 2), bSends(n_ + 2);
  std::vector<double> comm(n_ + 2);
  for (int i = 0; i < n_; ++i) {
    std::fill(held.begin(), held.end(), 0);
    std::fill(recv.begin(), recv.end(), 0);
    std::fill(send.begin(), send.end(), 0);
    std::fill(replica.begin(), replica.end(), 0);
    std::fill(comm.begin(), comm.end(), 0);
    std::fill(fSends.begin(), fSends.end(), 0);
    std::fill(bSends.begin(), bSends.end(), 0);
    // A replica for j in (first reader >= i, owner] (every j past the first
    // reader when the owner lies before i).
    for (const SharedState &st : chain.shared) {
      int r = firstAtOrAfter(st.readers, i);
      if (r < 0 || (st.owner >= i && st.owner < r))
        continue;
      replica[r + 1] += st.bytes;
      if (st.owner >= i)
        replica[st.owner + 1] -= st.bytes;
    }
    for (const ChainValue &v : chain.values) {
      if (int h = firstAtOrAfter(v.holders, i); h >= 0)
        held[h + 1] += v.bytes;
      if (v.producer < 0 || v.readers.empty())
        continue;
      if (v.producer < i) {
        if (int r = firstAtOrAfter(v.readers, i); r >= 0) {
          recv[r + 1] += v.bytes;
          comm[r + 1] += link.messageTime(v.bytes);
          if (v.gradBytes) { // its gradient goes back from this stage's B
            bSends[r + 1] += 1;
            comm[r + 1] += link.sendSeconds;
          }
        }
      } else if (v.readers.back() > v.producer) {
        int from = v.producer + 1, to = v.readers.back() + 1;
        send[from] += v.bytes;
        send[to] -= v.bytes;
        fSends[from] += 1;
        fSends[to] -= 1;
        double back = (v.gradBytes ? link.messageTime(v.gradBytes) : 0) +
                      link.sendSeconds;
        comm[from] += back;
        comm[to] -= back;
      }
    }
    int64_t h = 0, r = 0, s = 0, rep = 0, fs = 0, bs = 0;
    double c = 0;
    for (int end = i + 1; end <= n_; ++end) {
      // Held and received bytes accumulate from i + 1 on; sends are a
      // difference array from 0 on, and none starts at or before i.
      h += held[end];
      r += recv[end];
      s += send[end];
      c += comm[end];
      rep += replica[end];
      fs += fSends[end];
      bs += bSends[end];
      size_t cell = at(i, end);
      replica_[cell] = rep;
      held_[cell] = h;
      recv_[cell] = r;
      send_[cell] = s;
      fSends_[cell] = fs;
      bSends_[cell] = bs;
      // A difference array of doubles leaves rounding (-3e-21) where the
      // adds and subtractions cancel; a time is never below 0.
      comm_[cell] = std::max(c, 0.0);
    }
  }
}

int64_t heldMicrobatches(const SolverOptions &opts, int stage) {
  if (!opts.heldMicrobatches.empty())
    return opts.heldMicrobatches[std::min<size_t>(
        stage, opts.heldMicrobatches.size() - 1)];
  return std::min<int64_t>(opts.stages - stage, opts.microbatches);
}

double predictedStepTime(const StageCostTable &table,
                         llvm::ArrayRef<int> starts, int64_t microbatches) {
  double sum = 0, slowest = 0;
  for (size_t s = 0; s < starts.size(); ++s) {
    int end = s + 1 < starts.size() ? starts[s + 1] : table.numLayers();
    double t = table.time(starts[s], end);
    sum += t;
    slowest = std::max(slowest, t);
  }
  return sum + double(microbatches - 1) * slowest;
}

namespace {

// One dynamic program over the cut points: the least sum of stage times
// with every stage taking at most `bottleneck` and fitting the cap.
// best[k][j]: layers [0, j) in k stages; from[k][j]: where stage k-1 starts.
class BoundedSplitter {
public:
  BoundedSplitter(const StageCostTable &table, const SolverOptions &opts)
      : table_(table), opts_(opts), n_(table.numLayers()), p_(opts.stages),
        best_(size_t(p_ + 1) * (n_ + 1)), from_(best_.size()) {}

  // The split, or none when no split meets the bounds.
  std::optional<std::vector<int>> run(double bottleneck) {
    std::fill(best_.begin(), best_.end(), kInf);
    best_[0] = 0;
    for (int k = 1; k <= p_; ++k) {
      int64_t held = heldMicrobatches(opts_, k - 1);
      // Stage k-1 ends at j; the p - k stages after it need a layer each.
      for (int j = k; j <= n_ - (p_ - k); ++j)
        for (int i = k - 1; i < j; ++i) {
          double before = cell(k - 1, i);
          double t = table_.time(i, j);
          if (before == kInf || t > bottleneck ||
              (opts_.memCap && table_.peakBytes(i, j, held) > *opts_.memCap))
            continue;
          if (before + t < cell(k, j)) {
            cell(k, j) = before + t;
            from_[index(k, j)] = i;
          }
        }
    }
    if (cell(p_, n_) == kInf)
      return std::nullopt;
    std::vector<int> starts(p_);
    for (int k = p_, j = n_; k > 0; --k)
      j = starts[k - 1] = from_[index(k, j)];
    return starts;
  }

private:
  size_t index(int k, int j) const { return size_t(k) * (n_ + 1) + j; }
  double &cell(int k, int j) { return best_[index(k, j)]; }

  const StageCostTable &table_;
  const SolverOptions &opts_;
  int n_, p_;
  std::vector<double> best_;
  std::vector<int> from_;
};

// Every time a stage can take, sorted and distinct: the bottleneck of the
// best split is one of them.
std::vector<double> candidateBottlenecks(const StageCostTable &table) {
  std::vector<double> times;
  for (int i = 0; i < table.numLayers(); ++i)
    for (int j = i + 1; j <= table.numLayers(); ++j)
      times.push_back(table.time(i, j));
  std::sort(times.begin(), times.end());
  times.erase(std::unique(times.begin(), times.end()), times.end());
  return times;
}

llvm::Error tooManyStages(const StageCostTable &table, int stages) {
  return llvm::createStringError(
      llvm::inconvertibleErrorCode(),
      llvm::formatv("cannot cut {0} layers into {1} stages: use at most {0} "
                    "stages, or a larger --layer-depth for more layers",
                    table.numLayers(), stages)
          .str());
}

} // namespace

llvm::Expected<ChainSplit> solveChain(const StageCostTable &table,
                                      const SolverOptions &opts) {
  if (opts.stages < 1 || opts.microbatches < 1)
    return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                   "stages and microbatches must be >= 1");
  if (opts.stages > table.numLayers())
    return tooManyStages(table, opts.stages);
  BoundedSplitter splitter(table, opts);
  std::optional<std::vector<int>> unbounded = splitter.run(kInf);
  if (!unbounded) {
    int64_t cap = smallestFittingCap(table, opts);
    return llvm::createStringError(
        llvm::inconvertibleErrorCode(),
        llvm::formatv("no split of {0} layers into {1} stages fits the "
                      "memory cap of {2} per stage; the smallest cap that "
                      "fits is {3} ({4} bytes)",
                      table.numLayers(), opts.stages, formatBytes(*opts.memCap),
                      formatBytes(cap), cap)
            .str());
  }
  // The least sum of stage times any split reaches bounds every candidate's
  // objective from below.
  double leastSum = predictedStepTime(table, *unbounded, 1);
  std::vector<double> candidates = candidateBottlenecks(table);
  // Feasibility only grows with the bottleneck: binary search the smallest.
  size_t lo = 0, hi = candidates.size() - 1;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (splitter.run(candidates[mid]))
      hi = mid;
    else
      lo = mid + 1;
  }
  ChainSplit best;
  best.stepTime = kInf;
  double slowerRounds = double(opts.microbatches - 1);
  for (size_t c = lo; c < candidates.size(); ++c) {
    if (leastSum + slowerRounds * candidates[c] >= best.stepTime)
      break;
    std::optional<std::vector<int>> starts = splitter.run(candidates[c]);
    if (!starts)
      continue;
    double step = predictedStepTime(table, *starts, opts.microbatches);
    if (step < best.stepTime)
      best = {std::move(*starts), step};
  }
  return best;
}

int64_t smallestFittingCap(const StageCostTable &table,
                           const SolverOptions &opts) {
  // best[k][j]: the least possible largest peak of layers [0, j) in k stages.
  int n = table.numLayers(), p = opts.stages;
  constexpr int64_t kNone = std::numeric_limits<int64_t>::max();
  std::vector<std::vector<int64_t>> best(p + 1,
                                         std::vector<int64_t>(n + 1, kNone));
  best[0][0] = 0;
  for (int k = 1; k <= p; ++k)
    for (int j = k; j <= n - (p - k); ++j)
      for (int i = k - 1; i < j; ++i)
        if (best[k - 1][i] != kNone)
          best[k][j] = std::min(
              best[k][j],
              std::max(best[k - 1][i],
                       table.peakBytes(i, j, heldMicrobatches(opts, k - 1))));
  return best[p][n];
}

} // namespace cleave::passes
