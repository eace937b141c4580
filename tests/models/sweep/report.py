"""The sweep's results.json as a markdown table, totals and ranked reasons.

    python3 tests/models/sweep/report.py /tmp/cleave-zoo/results.json > table.md
    python3 tests/models/sweep/report.py --doc /tmp/cleave-zoo/results.json > docs/models.md
"""

import collections
import json
import re
import sys

COLUMNS = ("exported", "imported", "grads", "stages", "threads", "loss")
REASON_KEYS = ("reason", "grads_reason", "train_reason", "stages_reason", "threads_reason",
               "loss_reason")


def cell(rec, col):
    v = rec.get(col)
    if v is None:
        return "-"
    if col == "grads" and "grad_err_cleave" in rec:
        mark = " (f64: %.0e)" % rec["grad_err_f64"] if v and "grads_note" in rec else ""
        return "%s %.0e/%.0e%s" % ("yes" if v else "**no**", rec["grad_err_cleave"],
                                   rec["grad_err_torch"], mark)
    if col == "loss" and "loss_after_rel" in rec:
        mark = ""
        if v and "loss_after_rel_f64" in rec:
            mark = " (f64: %.0e)" % rec["loss_after_rel_f64"]
        elif v and "loss_note" in rec:
            mark = " (chaotic)"
        return "%s %.0e%s" % ("yes" if v else "**no**", rec["loss_after_rel"], mark)
    return "yes" if v else "**no**"


def reasons(rec):
    out = []
    for k in REASON_KEYS:
        if rec.get(k):
            out.append(rec[k])
    return out


def family_of(reason):
    """A reason without its model-specific parts (node and tensor names,
    numbers), for counting how many exports one cause blocks."""
    m = re.search(r"unsupported op '([^']+)'", reason)
    if m:
        where = " (in an ONNX function body of '%s')" % re.search(
            r"function body of '([^']+)'", reason).group(1) if "function body" in reason else ""
        return "unsupported op '%s'%s" % (m.group(1), where)
    if reason.startswith("trained tensors differ"):
        return ("cleave trains tensors PyTorch does not train (buffers, requires_grad=False "
                "parameters: final_logits_bias, sinusoidal embed_positions)")
    if "Could not guard on data-dependent expression" in reason:
        return "export: Could not guard on data-dependent expression (torch.export)"
    if reason.startswith("gradient error"):
        return "gradients beyond 10x PyTorch float32's error"
    if reason.startswith("loss after"):
        return "loss after 3 steps differs from PyTorch's"
    if "differs from 1" in reason:
        return "bits depend on --threads"
    if reason.startswith("2-stage parameters differ"):
        return "2-stage bits differ from 1-stage"
    if "is nan" in reason or "has nan" in reason or "non-finite" in reason:
        return "training goes non-finite (cleave-run stops)"
    r = re.sub(r"'[^']*'", "'…'", reason)
    r = re.sub(r"\b(node|value|tensor|input|initializer|module) \S+", r"\1 …", r)
    r = re.sub(r"[-+]?\d+(\.\d+)?(e[-+]?\d+)?", "N", r)
    r = re.sub(r"\x1b\[[0-9;]*m", "", r)
    return r[:200]


def op_reason(reason):
    m = re.search(r"unsupported op '?([A-Za-z0-9_:]+)'?", reason, re.I) or \
        re.search(r"op '([A-Za-z0-9_:]+)'", reason)
    return m.group(1) if m else None


def esc(s):
    return s.replace("|", "\\|").replace("\n", " ")


def table(results, meta):
    lines = []
    recs = list(results.values())
    recs.sort(key=lambda r: (r.get("family", ""), r["model"], r["exporter"]))
    lines.append("| model | class | exporter | exported | imported | grads (cleave/torch err) "
                 "| 2 stages = 1 | threads 1/2/4 | loss after 3 steps (rel) | reason |")
    lines.append("|---|---|---|---|---|---|---|---|---|---|")
    for r in recs:
        lines.append("| %s | `%s` | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            r["model"], r.get("class", ""), r["exporter"],
            *[cell(r, c) for c in COLUMNS], esc("; ".join(reasons(r)))[:400]))
    lines.append("")
    lines.append(totals(recs))
    return "\n".join(lines) + "\n"


def totals(recs):
    out = []
    for exp in sorted({r["exporter"] for r in recs}):
        for fam in sorted({r.get("family", "") for r in recs}) + ["all"]:
            rs = [r for r in recs if r["exporter"] == exp and (fam == "all" or
                                                              r.get("family") == fam)]
            if not rs:
                continue
            counts = ["%s %d" % (c, sum(1 for r in rs if r.get(c) is True)) for c in COLUMNS]
            full = sum(1 for r in rs if all(r.get(c) is True for c in COLUMNS))
            out.append("- **%s, %s**: %d models; %s; all six: %d" % (
                exp, fam, len(rs), ", ".join(counts), full))
    rank = collections.Counter()
    examples = collections.defaultdict(list)
    for r in recs:
        first = next(iter(reasons(r)), None)
        if not first:
            continue
        key = family_of(first)
        rank[key] += 1
        examples[key].append("%s-%s" % (r["model"], r["exporter"]))
    out.append("")
    out.append("First failure per export, grouped (count: reason; exports):")
    out.append("")
    for key, n in rank.most_common():
        ex = examples[key]
        out.append("- %d: `%s` (%s%s)" % (n, esc(key), ", ".join(ex[:6]),
                                          ", ..." if len(ex) > 6 else ""))
    return "\n".join(out)


DOC_HEAD = """# Models: which PyTorch model classes cleave trains

This page is generated by `tests/models/sweep/report.py --doc` from the
`results.json` of the model-zoo sweep (`tests/models/sweep/zoo.py`; its
README says how to run it). Each row is one small random-init
configuration of a library class (transformers, torchvision, timm, a
small model built from torch.nn's attention modules, or a small network
trained with one of torch.nn's losses), wrapped to return its loss (the class's own `labels=` loss where it has one), exported
by PyTorch in `train()` with every dropout 0, and checked through cleave's
command-line tools:

| column | holds when |
|---|---|
| exported | `torch.onnx.export` succeeds: dynamo is the README's call (`dynamo=True, optimize=False`), legacy is `dynamo=False, opset_version=17, training=TrainingMode.TRAINING, do_constant_folding=False`; both followed by the README's `annotate_export` (requires_grad=False parameters and `padding_idx` recorded in the file) |
| imported | `cleavec model.onnx --stages 1 --microbatches 4 -o p1.cplan` exits 0 |
| grads | the first microbatch's gradients (`cleave-opt model.onnx --passes=<cleavec's training pipeline> --run`) are within 10x PyTorch float32's own error against float64 (the metric of `tests/unit/corpus_test.cpp`; the figures are cleave's / PyTorch float32's), against the module's `train()` semantics (BatchNorm with batch statistics) |
| 2 stages = 1 | after 3 steps (4 microbatches each, SGD lr %(lr)g momentum %(momentum)g) a 2-stage plan's `--save` output is byte-identical to the 1-stage plan's |
| threads 1/2/4 | the 1-stage plan gives the same bytes with `--threads` 1, 2 and 4 |
| loss after 3 steps | the trained model's loss on the first microbatch (`cleave-opt trained.onnx --run`) is within %(loss_rtol)g (relative) of PyTorch's after the same 3 steps |

Where float32 misses the grads or the loss bound, a float64 recheck tells
rounding from a wrong graph (`zoo.py float64_recheck`): the module is
exported again in float64, and the column holds, marked `(f64: ...)`, when
cleave's float64 gradients are within %(f64_rtol)g of PyTorch's float64
ones (and float32 passes on a second input sample), or when its float64
3-step loss is within %(f64_loss_rtol)g of PyTorch's (the same lr and
momentum: cleave applies an attribute or hyperparameter held in float32
to float64 data as the decimal it was written as). `(chaotic)` marks a loss within 10x PyTorch
float32's own distance to float64 after the steps.

A column is `-` where an earlier one failed. The reason is the first
failing column's: the first error line of the cleave tool, or of the
exporter. Where one reason blocks several models, the ranked list under the
table counts them.

- date: %(date)s
- machine: %(machine)s
- PyTorch %(torch)s, torchvision %(torchvision)s, transformers %(transformers)s, timm %(timm)s
- command: `HF_HUB_OFFLINE=1 nice $VENV/bin/python tests/models/sweep/%(command)s`

"""


def main():
    args = sys.argv[1:]
    doc = "--doc" in args
    args = [a for a in args if a != "--doc"]
    with open(args[0]) as f:
        d = json.load(f)
    meta = collections.defaultdict(lambda: "?", d.get("meta", {}))
    if doc:
        sys.stdout.write(DOC_HEAD % dict({"timm": "-"}, **meta))
    sys.stdout.write(table(d["results"], meta))


if __name__ == "__main__":
    main()
