#include "passes/schedule/ScheduleCsv.h"
#include "support/FileIO.h"

#include "llvm/ADT/SmallVector.h"
#include "llvm/Support/MemoryBuffer.h"

#include <algorithm>
#include <cstring>

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
llvm::Expected<Action> parseAction(llvm::StringRef cell, int rank,
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
  if (int(stage) != rank)
    return csvError(where + ": '" + cell.str() + "' is for stage " +
                    std::to_string(stage) + ", but this row is rank " +
                    std::to_string(rank) + "'s (cleave runs one stage per rank)");
  Action a = compute(kind->kind, int(mb));
  if (isComm(a.kind))
    a.peer = messagePeer(rank, a.kind);
  return a;
}

} // namespace

std::string scheduleToCsv(const Schedule &s, bool computeOnly) {
  std::string out;
  for (int st = 0; st < s.stages; ++st) {
    std::string row;
    for (const Action &a : s.actions[st]) {
      const char *token = csvToken(a.kind);
      if (!token || (computeOnly && isComm(a.kind)))
        continue;
      row += (row.empty() ? "" : ",") + std::to_string(st) + token +
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
  Schedule s;
  s.name = name;
  s.stages = int(lines.size());
  for (int rank = 0; rank < s.stages; ++rank) {
    llvm::SmallVector<llvm::StringRef, 64> cells;
    lines[rank].rtrim("\r").split(cells, ',');
    std::vector<Action> row;
    for (size_t c = 0; c < cells.size(); ++c) {
      llvm::StringRef cell = cells[c].trim();
      if (cell.empty())
        continue;
      std::string where = source + ": line " + std::to_string(rank + 1) +
                          ", cell " + std::to_string(c + 1);
      auto a = parseAction(cell, rank, where);
      if (!a)
        return a.takeError();
      s.microbatches = std::max(s.microbatches, a->microbatch + 1);
      row.push_back(*a);
    }
    s.actions.push_back(std::move(row));
  }
  if (s.stages == 0 || s.microbatches == 0)
    return csvError(source + ": no schedule actions in the CSV");
  if (!hasCommunication(s))
    insertCommunication(s);
  for (auto &row : s.actions)
    row.push_back(Action{ActionKind::Step, -1, -1});
  return s;
}

llvm::Expected<Schedule> readScheduleCsvFile(const std::string &path) {
  auto buf = support::readFile(path, "schedule CSV", support::kMaxTextBytes);
  if (!buf)
    return buf.takeError();
  return scheduleFromCsv((*buf)->getBuffer(), path, "csv:" + path);
}

} // namespace cleave::passes::schedule
