#include "passes/schedule/ScheduleCsv.h"
#include "support/FileIO.h"

#include "llvm/ADT/SmallVector.h"
#include "llvm/Support/MemoryBuffer.h"

#include <algorithm>
#include <climits>
#include <cstring>
#include <map>

namespace cleave::passes::schedule {

namespace {

// cleave's kinds and PyTorch's letters for them; longer names first so a
// prefix never wins.
struct CsvKind {
  const char *token;
  ActionKind kind;
};
const CsvKind kCsvKinds[] = {
    {"SEND_F", ActionKind::SendF}, {"RECV_F", ActionKind::RecvF},
    {"SEND_B", ActionKind::SendB}, {"RECV_B", ActionKind::RecvB},
    {"F", ActionKind::F},          {"I", ActionKind::B},
    {"W", ActionKind::W},          {"B", ActionKind::BW},
};

const char *csvToken(ActionKind kind) {
  for (const CsvKind &k : kCsvKinds)
    if (k.kind == kind)
      return k.token;
  return nullptr; // STEP has no CSV form
}

llvm::Error csvError(const std::string &msg) {
  return llvm::createStringError(llvm::inconvertibleErrorCode(), msg);
}

// Reads `<stage><type><microbatch>`; the error says what was expected.
llvm::Expected<PlacedAction> parseAction(llvm::StringRef cell,
                                         const std::string &where) {
  llvm::StringRef rest = cell;
  unsigned stage;
  size_t digits = rest.find_first_not_of("0123456789");
  if (digits == 0 || digits == llvm::StringRef::npos ||
      rest.take_front(digits).getAsInteger(10, stage))
    return csvError(where + ": cannot read '" + cell.str() +
                    "' (expected <stage><F|I|W|B|SEND_F|RECV_F|SEND_B|RECV_B>"
                    "<microbatch>, e.g. 0F3)");
  rest = rest.drop_front(digits);
  const CsvKind *kind = nullptr;
  for (const CsvKind &k : kCsvKinds)
    if (rest.startswith(k.token)) {
      kind = &k;
      break;
    }
  unsigned mb;
  llvm::StringRef mbText = kind ? rest.drop_front(strlen(kind->token)) : "";
  if (!kind || mbText.empty() || mbText.getAsInteger(10, mb))
    return csvError(where + ": cannot read '" + cell.str() +
                    "' (cleave reads F, I, W, B, SEND_F, RECV_F, SEND_B, "
                    "RECV_B actions with a microbatch, e.g. 0F3)");
  if (stage > unsigned(INT_MAX / 2) || mb > unsigned(INT_MAX / 2))
    return csvError(where + ": '" + cell.str() + "' is out of range");
  Action a = compute(kind->kind, int(mb));
  if (isComm(a.kind))
    a.peer = messagePeer(int(stage), a.kind);
  return PlacedAction{int(stage), a};
}

} // namespace

std::string scheduleToCsv(const Schedule &s, bool computeOnly) {
  std::string out;
  for (const auto &program : rankPrograms(s)) {
    std::string row;
    for (const RankAction &ra : program) {
      const Action &a = s.actions[ra.stage][ra.index];
      const char *token = csvToken(a.kind);
      if (!token || (computeOnly && isComm(a.kind)))
        continue;
      row += (row.empty() ? "" : ",") + std::to_string(ra.stage) + token +
             std::to_string(a.microbatch);
    }
    out += row + "\n";
  }
  return out;
}

llvm::Expected<Schedule> scheduleFromCsv(llvm::StringRef text,
                                         const std::string &source,
                                         const std::string &name) {
  llvm::SmallVector<llvm::StringRef, 16> lines;
  text.rtrim().split(lines, '\n');
  std::vector<std::vector<PlacedAction>> programs;
  std::map<int, int> rankOf; // stage -> the row it appears in
  int microbatches = 0;
  for (int rank = 0; rank < int(lines.size()); ++rank) {
    llvm::SmallVector<llvm::StringRef, 64> cells;
    lines[rank].rtrim("\r").split(cells, ',');
    std::vector<PlacedAction> row;
    for (size_t c = 0; c < cells.size(); ++c) {
      llvm::StringRef cell = cells[c].trim();
      if (cell.empty())
        continue;
      std::string where = source + ": line " + std::to_string(rank + 1) +
                          ", cell " + std::to_string(c + 1);
      auto a = parseAction(cell, where);
      if (!a)
        return a.takeError();
      auto [it, fresh] = rankOf.insert({a->stage, rank});
      if (!fresh && it->second != rank)
        return csvError(where + ": '" + cell.str() + "' is for stage " +
                        std::to_string(a->stage) + ", which line " +
                        std::to_string(it->second + 1) +
                        " (rank " + std::to_string(it->second) +
                        ") already runs; a stage runs on one rank");
      microbatches = std::max(microbatches, a->action.microbatch + 1);
      row.push_back(*a);
    }
    programs.push_back(std::move(row));
  }
  if (programs.empty() || microbatches == 0)
    return csvError(source + ": no schedule actions in the CSV");
  int stages = rankOf.rbegin()->first + 1;
  for (int st = 0; st < stages; ++st)
    if (!rankOf.count(st))
      return csvError(source + ": no row has actions of stage " +
                      std::to_string(st) + " (the stages run 0.." +
                      std::to_string(stages - 1) + ")");
  std::vector<int> placement;
  bool onePerRank = stages == int(programs.size());
  for (auto [st, rank] : rankOf) {
    placement.push_back(rank);
    onePerRank = onePerRank && st == rank;
  }
  for (int st = 0; st < stages; ++st)
    programs[size_t(rankOf[st])].push_back(
        {st, Action{ActionKind::Step, -1, -1}});
  if (onePerRank)
    placement.clear();
  Schedule s = scheduleFromPrograms(name, stages, microbatches,
                                    std::move(placement), programs);
  if (!hasCommunication(s))
    insertCommunication(s);
  return s;
}

llvm::Expected<Schedule> readScheduleCsvFile(const std::string &path) {
  auto buf = support::readFile(path, "schedule CSV", support::kMaxTextBytes);
  if (!buf)
    return buf.takeError();
  return scheduleFromCsv((*buf)->getBuffer(), path, "csv:" + path);
}

} // namespace cleave::passes::schedule
