#!/usr/bin/env python3
"""Export the PyTorch 2 model corpus in tests/models/corpus/.

Run with the pinned PyTorch 2 venv (make-venv.sh in this folder):

    bash tests/models/corpus/make-venv.sh
    $VENV/bin/python tests/models/corpus/export_corpus.py [--only gpt2,vit]

Every model is a small random-init configuration of the real library class
(transformers GPT2LMHeadModel, LlamaForCausalLM, BertForMaskedLM;
torchvision resnet18 topology, mobilenet_v2, VisionTransformer), wrapped in

    class WithLoss(nn.Module):
        def __init__(self, m): super().__init__(); self.m = m
        def forward(self, ...): return loss

(WithLoss, CausalLMWithLoss, MaskedLMWithLoss below), so every parameter
name starts with "m.". Each model is exported twice, in train() mode with
fixed shapes, into its own folder <model>-<exporter>/:

    dynamo   torch.onnx.export(wrapped, args, path, dynamo=True,
             optimize=False, external_data=False)   (default opset)
    legacy   torch.onnx.export(wrapped, args, path, dynamo=False,
             opset_version=17, training=TrainingMode.TRAINING,
             do_constant_folding=False)

plus gpt2 once more with the dynamo default optimize=True into
gpt2-dynamo-folded/model.onnx and resnet18-dynamo-folded/model.onnx (the
model only).

Each export folder holds (the layout of tests/models/training/*/, see
tests/models/README.md and README.md here):

    model.onnx                    the graph, output the scalar `loss`
    inputs/<input>.npy            the inputs, float32 / int64
    reference/loss.npy            PyTorch float32 loss, shape ()
    reference/grad.<init>.npy     float32 d loss / d parameter, keyed by the
                                  ONNX initializer holding the parameter (a
                                  tied weight once, with the summed gradient)
    reference/params.txt          the parameter initializers, graph order
    reference/buffers.txt         every other initializer, graph order
    reference64/loss.npy          the same computed by a float64 copy of the
    reference64/grad.<init>.npy   module (inputs cast), stored as float64
    steps/data/<input>.npy        3 steps x 4 microbatches of B rows; row
                                  (s * 4 + m) * B + k is sample k of
                                  microbatch m of step s
    steps/params/<init>.npy       parameters after 3 steps of
                                  torch.optim.SGD(lr=0.1, momentum=0.9),
                                  each: zero_grad, (loss(mb m) / 4).backward()
                                  for m = 0..3, step; float32
    steps/losses.npy              float32 [3], each step's mean microbatch
                                  loss before its update
    steps/buffers/<buf>.npy       (BatchNorm models) PyTorch's running
                                  statistics after the 12 forwards, starting
                                  from the values in model.onnx
    steps/hyper.txt               lr, momentum, microbatches, steps, batch
    info.json                     exporter, opset, IR version, op histogram,
                                  parameter count, inputs, accuracy, notes

The references are what PyTorch's train() computes for the module. The
dynamo exporter's onnxscript translation of
aten._native_batch_norm_legit_functional writes an inference-form
BatchNormalization (no training_mode, one output) whatever the module's
mode; its graph signature records the running statistics as BUFFER_MUTATION
outputs, which only a train()-mode BatchNorm produces, and cleave's importer
reads that. The references use train() BatchNorm for both exporters, and
info.json / the printout say so.

Everything is seeded; two runs from the same checkout write identical
files. The dynamo exporter's node metadata pkg.torch.onnx.stack_trace holds
absolute source paths and line numbers (of this script too), so a run from
another checkout or venv path, or after an edit above a wrapper's forward,
changes those strings in the dynamo .onnx files and nothing else.
"""

import argparse
import collections
import contextlib
import copy
import json
import os
import re
import shutil
import warnings

import numpy as np
import onnx
import onnx.numpy_helper
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten, tree_map

HERE = os.path.dirname(os.path.abspath(__file__))

LEGACY_OPSET = 17
STEPS = 3
MICROBATCHES = 4
STEPS_LR = 0.1
STEPS_MOMENTUM = 0.9
MODEL_SEED = 100       # + the model's index: module construction
INPUT_SEED = 200       # + index: the exported inputs
STEPS_SEED = 1000      # + index: the multi-step dataset
PERTURB = 0.1          # std of the noise added to constant-initialized params
SEQ = 16
VOCAB = 128


class WithLoss(nn.Module):
    """The usual training wrapper: forward returns the scalar loss
    (classifiers: cross-entropy of the logits)."""

    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, x, labels):
        return F.cross_entropy(self.m(x), labels)


class CausalLMWithLoss(nn.Module):
    """WithLoss for a transformers causal LM: next-token cross-entropy, what
    the model's own loss (labels=input_ids, ForCausalLMLoss) computes, spelled
    out because ForCausalLMLoss casts the logits to float32, which would make
    the float64 reference float32 from the logits on."""

    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, input_ids, attention_mask):
        logits = self.m(input_ids=input_ids, attention_mask=attention_mask,
                        use_cache=False).logits
        return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]),
                               input_ids[:, 1:].reshape(-1))


class MaskedLMWithLoss(nn.Module):
    """WithLoss for a transformers masked LM (labels -100 are ignored)."""

    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, input_ids, attention_mask, labels):
        return self.m(input_ids=input_ids, attention_mask=attention_mask,
                      labels=labels).loss


# --------------------------------------------------------------------------
# Models. Each make_<name>() returns (module, sample, wrapper): the library
# model, sample(gen, n) drawing an OrderedDict of n input rows, and the
# WithLoss class whose forward takes those inputs in that order.

def lm_sample(gen, n):
    ids = torch.randint(0, VOCAB, (n, SEQ), generator=gen, dtype=torch.int64)
    # An all-ones 2-D attention mask, as a tokenizer returns it without
    # padding. It is a graph input because transformers' mask code, given
    # no attention_mask, checks position_ids for packed sequences
    # (masking_utils.find_packed_sequence_indices: torch.diff, which the
    # legacy exporter cannot export at any opset, plus cumsum).
    mask = torch.ones(n, SEQ, dtype=torch.int64)
    return collections.OrderedDict([("input_ids", ids), ("attention_mask", mask)])


def make_gpt2():
    import transformers
    cfg = transformers.GPT2Config(
        vocab_size=VOCAB, n_positions=32, n_embd=32, n_layer=2, n_head=2,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, summary_first_dropout=0.0,
        initializer_range=0.1, bos_token_id=0, eos_token_id=0,
        attn_implementation="sdpa")
    return transformers.GPT2LMHeadModel(cfg), lm_sample, CausalLMWithLoss


def make_llama():
    import transformers
    cfg = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
        attention_dropout=0.0, initializer_range=0.1, bos_token_id=0, eos_token_id=0,
        pad_token_id=None, attn_implementation="sdpa")
    return transformers.LlamaForCausalLM(cfg), lm_sample, CausalLMWithLoss


def bert_sample(gen, n):
    ids = torch.randint(1, VOCAB, (n, SEQ), generator=gen, dtype=torch.int64)
    lengths = torch.randint(SEQ - 4, SEQ + 1, (n,), generator=gen)
    mask = (torch.arange(SEQ)[None, :] < lengths[:, None]).to(torch.int64)
    ids = torch.where(mask.bool(), ids, torch.zeros_like(ids))   # pad id 0
    pick = torch.rand(n, SEQ, generator=gen) < 0.25
    pick[:, 1] = True                     # at least one label per row
    pick &= mask.bool()
    targets = torch.randint(1, VOCAB, (n, SEQ), generator=gen, dtype=torch.int64)
    labels = torch.where(pick, targets, torch.full_like(targets, -100))
    return collections.OrderedDict(
        [("input_ids", ids), ("attention_mask", mask), ("labels", labels)])


def make_bert():
    import transformers
    cfg = transformers.BertConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=32, type_vocab_size=2,
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
        initializer_range=0.1, pad_token_id=0, attn_implementation="sdpa")
    return transformers.BertForMaskedLM(cfg), bert_sample, MaskedLMWithLoss


def image_sample(gen, n):
    x = torch.randn(n, 3, 32, 32, generator=gen)
    labels = torch.randint(0, 10, (n,), generator=gen, dtype=torch.int64)
    return collections.OrderedDict([("x", x), ("labels", labels)])


RESNET_WIDTH = 4   # resnet18's is 64: 11.2M parameters, 44 MB of float32
RESNET_STRIDES = (1, 2, 2, 1)   # resnet18's: (1, 2, 2, 2)


def make_resnet18():
    """torchvision's ResNet-18 (torchvision.models.resnet.ResNet, BasicBlock,
    layers [2, 2, 2, 2], num_classes 10) with two changes: every width is
    RESNET_WIDTH / 64 of resnet18's (44K parameters instead of 11.2M), and
    layer4 has stride 1. The modules, names and ops are resnet18()'s
    (layer4.0 keeps its downsample: its width still doubles). ResNet's
    constructor hard-codes widths and strides, so the stem, the four stages
    and fc are rebuilt with its own _make_layer and initialized as its
    constructor does.

    Why layer4 stride 1: with 32x32 images resnet18 downsamples to 1x1
    maps in layer4, where a train-mode BatchNorm normalizes each channel
    over the batch's 4 values; channels whose 4 values nearly agree make
    the gradient ill-conditioned (float32 vs float64 up to 7e-5) and 3 SGD
    steps chaotic (float32 and float64 parameters 1e-1 apart). With 2x2
    maps (16 values per channel) both are ~1e-6."""
    from torchvision.models.resnet import BasicBlock, ResNet
    m = ResNet(BasicBlock, [2, 2, 2, 2], num_classes=10)
    w = RESNET_WIDTH
    m.inplanes = w
    m.conv1 = nn.Conv2d(3, w, kernel_size=7, stride=2, padding=3, bias=False)
    m.bn1 = m._norm_layer(w)
    m.layer1 = m._make_layer(BasicBlock, w, 2, stride=RESNET_STRIDES[0])
    m.layer2 = m._make_layer(BasicBlock, 2 * w, 2, stride=RESNET_STRIDES[1])
    m.layer3 = m._make_layer(BasicBlock, 4 * w, 2, stride=RESNET_STRIDES[2])
    m.layer4 = m._make_layer(BasicBlock, 8 * w, 2, stride=RESNET_STRIDES[3])
    m.fc = nn.Linear(8 * w * BasicBlock.expansion, 10)
    for mod in m.modules():   # ResNet.__init__'s initialization
        if isinstance(mod, nn.Conv2d):
            nn.init.kaiming_normal_(mod.weight, mode="fan_out", nonlinearity="relu")
        elif isinstance(mod, (nn.BatchNorm2d, nn.GroupNorm)):
            nn.init.constant_(mod.weight, 1)
            nn.init.constant_(mod.bias, 0)
    return m, image_sample, WithLoss


MOBILENET_WIDTH = 0.1
# torchvision's default inverted_residual_setting (t, c, n, s) with stride 1
# (not 2) in the second and third stages.
MOBILENET_SETTING = [[1, 16, 1, 1], [6, 24, 2, 1], [6, 32, 3, 1], [6, 64, 4, 2],
                     [6, 96, 3, 1], [6, 160, 3, 2], [6, 320, 1, 1]]


def make_mobilenet_v2():
    """torchvision.models.mobilenet_v2(num_classes=10, width_mult=0.1,
    dropout=0, inverted_residual_setting=MOBILENET_SETTING): 99K parameters
    (the 1280-wide last conv and classifier do not shrink with width_mult).

    Why the two stride-1 stages: the stock network downsamples 32x32 images
    to 1x1 maps from features.14 on, where each train-mode BatchNorm channel
    normalizes the batch's 4 values; some channels' 4 values agree to ~1e-4
    (batch variance 5e-8, below eps), and the float32 gradient is 4e-2 off
    the float64 one (max |g| 373). With 4x4 maps at the end: 1.6e-5."""
    import torchvision
    m = torchvision.models.mobilenet_v2(
        num_classes=10, width_mult=MOBILENET_WIDTH, dropout=0.0,
        inverted_residual_setting=[list(r) for r in MOBILENET_SETTING])
    return m, image_sample, WithLoss


def make_vit():
    import torchvision
    m = torchvision.models.VisionTransformer(
        image_size=32, patch_size=8, num_layers=2, num_heads=2, hidden_dim=32,
        mlp_dim=64, num_classes=10, dropout=0.0, attention_dropout=0.0)
    return m, image_sample, WithLoss


def denoise_sample(gen, n):
    x = torch.randn(n, 3, 16, 16, generator=gen)
    target = torch.randn(n, 3, 16, 16, generator=gen)
    return collections.OrderedDict([("x", x), ("target", target)])


class MseWithLoss(nn.Module):
    """WithLoss for an image-to-image model: the mean squared error to a
    target image."""

    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, x, target):
        return F.mse_loss(self.m(x), target)


class UNetBlock(nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, padding=1)
        self.norm1 = nn.GroupNorm(4, cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1)
        self.norm2 = nn.GroupNorm(4, cout)

    def forward(self, x):
        x = F.silu(self.norm1(self.conv1(x)))
        return F.silu(self.norm2(self.conv2(x)))


class UNet(nn.Module):
    """A small U-Net of the kind diffusion and segmentation models use:
    two levels down (average pooling), ConvTranspose2d up (a 2x2 stride-2
    one, and a grouped 3x3 stride-2 one with padding and output_padding),
    skip connections by concatenation, GroupNorm and SiLU, a residual to
    the input."""

    def __init__(self):
        super().__init__()
        self.down1 = UNetBlock(3, 8)
        self.down2 = UNetBlock(8, 16)
        self.mid = UNetBlock(16, 16)
        self.up2 = nn.ConvTranspose2d(16, 16, 3, stride=2, padding=1,
                                      output_padding=1, groups=2)
        self.dec2 = UNetBlock(32, 8)
        self.up1 = nn.ConvTranspose2d(8, 8, 2, stride=2)
        self.dec1 = UNetBlock(16, 8)
        self.out = nn.Conv2d(8, 3, 1)

    def forward(self, x):
        a = self.down1(x)
        b = self.down2(F.avg_pool2d(a, 2))
        m = self.mid(F.avg_pool2d(b, 2))
        u = self.dec2(torch.cat([self.up2(m), b], 1))
        u = self.dec1(torch.cat([self.up1(u), a], 1))
        return x + self.out(u)


def make_unet():
    return UNet(), denoise_sample, MseWithLoss


class RecurrentClassifier(nn.Module):
    """A sequence classifier of recurrent layers: an embedding, a 2-layer
    bidirectional LSTM (batch_first), a GRU over its outputs, and a linear
    head on the GRU's mean output plus its last hidden state."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 12)
        self.lstm = nn.LSTM(12, 10, num_layers=2, batch_first=True,
                            bidirectional=True)
        self.gru = nn.GRU(20, 8, batch_first=True)
        self.head = nn.Linear(8, 10)

    def forward(self, x):
        out, _ = self.lstm(self.emb(x))
        seq, last = self.gru(out)
        return self.head(seq.mean(1) + last[0])


def token_class_sample(gen, n):
    x = torch.randint(0, VOCAB, (n, SEQ), generator=gen, dtype=torch.int64)
    labels = torch.randint(0, 10, (n,), generator=gen, dtype=torch.int64)
    return collections.OrderedDict([("x", x), ("labels", labels)])


def make_rnn():
    return RecurrentClassifier(), token_class_sample, WithLoss


class Saturating(nn.Module):
    """Pre-activations of hundreds, past exp's range in float32 and float64,
    through the activations and losses PyTorch computes without
    overflowing there (ELU, CELU, SELU, log-sigmoid, softplus, logsumexp,
    BCE with logits) and exporters spell with Exp, Log and Sigmoid."""

    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(8, 16)
        self.out = nn.Linear(16 * 5, 10)

    def forward(self, x):
        z = self.inp(x) * 300.0
        h = torch.cat([F.elu(z, 0.8), F.celu(z, 0.7), F.selu(z),
                       F.logsigmoid(z), F.softplus(z)], -1)
        return self.out(h * 0.01), torch.logsumexp(z, -1), z


class SaturatingLoss(nn.Module):
    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, x, labels):
        logits, lse, z = self.m(x)
        target = (x[:, :1] > 0).to(z.dtype).expand_as(z)
        return (F.cross_entropy(logits, labels) + 0.001 * lse.mean() +
                0.01 * F.binary_cross_entropy_with_logits(z, target))


class TopKGate(nn.Module):
    """A mixture-of-experts style gate with a fixed k: the 2 largest of
    each row's router scores (torch.topk), softmax over their values, and
    the experts' outputs picked at their indices (torch.gather); gradients
    reach the router through the values."""

    def __init__(self):
        super().__init__()
        self.router = nn.Linear(8, 6)
        self.experts = nn.Linear(8, 6)
        self.head = nn.Linear(2, 10)

    def forward(self, x):
        top = torch.topk(self.router(x), 2, dim=-1)
        gate = torch.softmax(top.values, -1)
        picked = torch.gather(torch.tanh(self.experts(x)), -1, top.indices)
        low = torch.topk(self.router(x), 1, dim=0, largest=False).values[:, :2]
        return self.head(gate * picked + low)


class IndexPairs(nn.Module):
    """Advanced indexing by tensors computed at run time: a learned table
    read at (row, column) pairs from each sample's argmaxes, the row
    counted from the end (table[a, b], which the dynamo export writes as
    GatherND of runtime indices); gradients reach the table's picked
    entries, repeated pairs adding up. (A column counted from the end
    would not do: the legacy exporter flattens the pair to a * 5 + b,
    which for b < 0 is another row's entry; onnxruntime's loss shows it.)"""

    def __init__(self):
        super().__init__()
        self.table = nn.Parameter(torch.randn(6, 5, 4) * 0.5)
        self.proj = nn.Linear(8, 11)
        self.head = nn.Linear(4, 10)

    def forward(self, x):
        s = self.proj(x)
        a = s[:, :6].argmax(-1) - 6
        b = s[:, 6:].argmax(-1)
        return self.head(self.table[a, b] * torch.tanh(s[:, :4]))


class GridWarp(nn.Module):
    """Images warped by a predicted flow (optical flow, registration,
    spatial transformers): a 3x3 conv predicts a 2-channel offset field,
    added to the identity grid, and F.grid_sample reads the image there
    three ways (bilinear with zero padding, bilinear with border padding
    and align_corners, nearest with reflection); gradients reach the conv
    through the grid (bilinear) and the image through the samples; a
    linear head on the pooled result."""

    def __init__(self):
        super().__init__()
        self.offset = nn.Conv2d(3, 2, 3, padding=1)
        self.mix = nn.Conv2d(9, 4, 1)
        self.head = nn.Linear(4, 10)

    def forward(self, x):
        ys, xs = torch.meshgrid(torch.linspace(-1, 1, x.shape[2], dtype=x.dtype),
                                torch.linspace(-1, 1, x.shape[3], dtype=x.dtype),
                                indexing="ij")
        base = torch.stack([xs, ys], -1)[None]
        grid = base + 0.5 * torch.tanh(self.offset(x)).permute(0, 2, 3, 1)
        a = F.grid_sample(x, grid, mode="bilinear", padding_mode="zeros",
                          align_corners=False)
        b = F.grid_sample(x, 1.3 * grid, mode="bilinear", padding_mode="border",
                          align_corners=True)
        c = F.grid_sample(x * x, 1.6 * grid, mode="nearest",
                          padding_mode="reflection", align_corners=False)
        h = torch.relu(self.mix(torch.cat([a, b, c], 1)))
        return self.head(h.mean((2, 3)))


class DetachedBranches(nn.Module):
    """Gradients stopped by detach(): a straight-through rounding
    (VQ-VAE's h + (q(h) - h).detach()), a gate computed from a detached
    copy of the features (target networks, RAFT's refinement), and a
    detached running estimate subtracted from the logits. The dynamo export
    writes each detach() as an Identity whose metadata names aten.detach,
    which cleave imports as StopGradient; the legacy exporter drops
    detach() (the corpus holds only the dynamo export, and check_export
    reports the legacy one)."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 12)
        self.gate = nn.Linear(12, 12)
        self.head = nn.Linear(12, 10)

    def forward(self, x):
        h = torch.tanh(self.a(x))
        q = h + (torch.round(4 * h) / 4 - h).detach()
        g = torch.sigmoid(self.gate(h.detach()))
        logits = self.head(q * g)
        return logits - logits.mean(0, keepdim=True).detach()


class RowFill(nn.Module):
    """A matrix filled a row at a time, reading back rows and blocks of
    itself (the chunked delta rule of Qwen3.5 and OLMo-Hybrid in HF's
    reference code): each row i of a strictly lower triangular score
    matrix becomes itself plus the sum over j < i of its entries times
    rows j, written in place; the matrix as it was before the loop is read
    after it (so the first row write may not take its operand's bytes).
    The exporters write the row writes as
    ScatterElements or ScatterND and x[:, :i, :i] as two Slices; the
    gradient sums selects' and slices' gradients row by row (cleave adds
    them in place: docs/design/training.md)."""

    def __init__(self):
        super().__init__()
        self.q = nn.Linear(8, 8)
        self.k = nn.Linear(8, 8)
        self.head = nn.Linear(8, 10)

    def forward(self, x):
        t = x.shape[1]
        a = (self.q(x) @ self.k(x).transpose(1, 2) * 0.3).tril(-1)
        before = a.clone()
        for i in range(1, t):
            row = a[:, i, :i].clone()
            sub = a[:, :i, :i].clone()
            a[:, i, :i] = row + (row.unsqueeze(-1) * sub).sum(-2)
        return self.head(((a + 0.5 * before) @ x).mean(1))


def sequence_class_sample(gen, n):
    x = torch.randn(n, 6, 8, generator=gen)
    labels = torch.randint(0, 10, (n,), generator=gen, dtype=torch.int64)
    return collections.OrderedDict([("x", x), ("labels", labels)])


def warp_sample(gen, n):
    x = torch.randn(n, 3, 6, 7, generator=gen)
    labels = torch.randint(0, 10, (n,), generator=gen, dtype=torch.int64)
    return collections.OrderedDict([("x", x), ("labels", labels)])


def vector_class_sample(gen, n):
    x = torch.randn(n, 8, generator=gen)
    labels = torch.randint(0, 10, (n,), generator=gen, dtype=torch.int64)
    return collections.OrderedDict([("x", x), ("labels", labels)])


def make_saturating():
    return Saturating(), vector_class_sample, SaturatingLoss


def make_topk_gate():
    return TopKGate(), vector_class_sample, WithLoss


def make_index_pairs():
    return IndexPairs(), vector_class_sample, WithLoss


def make_grid_warp():
    return GridWarp(), warp_sample, WithLoss


def make_detached():
    return DetachedBranches(), vector_class_sample, WithLoss


def make_row_fill():
    return RowFill(), sequence_class_sample, WithLoss


# name -> (make, batch)
MODELS = collections.OrderedDict([
    ("gpt2", (make_gpt2, 2)),
    ("llama", (make_llama, 2)),
    ("bert", (make_bert, 2)),
    ("resnet18", (make_resnet18, 4)),
    ("mobilenet_v2", (make_mobilenet_v2, 4)),
    ("vit", (make_vit, 2)),
    ("unet", (make_unet, 2)),
    ("rnn", (make_rnn, 2)),
    ("saturating", (make_saturating, 4)),
    ("topk_gate", (make_topk_gate, 4)),
    ("index_pairs", (make_index_pairs, 8)),
    ("grid_warp", (make_grid_warp, 4)),
    ("detached", (make_detached, 8)),
    ("row_fill", (make_row_fill, 4)),
])
EXPORTERS = ("dynamo", "legacy")
# Models whose legacy export does not compute the module's gradients (the
# legacy exporter drops detach()): exported by dynamo only.
DYNAMO_ONLY = {"detached"}


# --------------------------------------------------------------------------

def rel_err(g, ref):
    """max over elements |g - ref| / max(max|ref|, 1e-6)."""
    g = np.asarray(g, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    if not ref.size:
        return 0.0
    scale = max(float(np.max(np.abs(ref))), 1e-6)
    return float(np.max(np.abs(g - ref))) / scale


def save(path, array):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    np.save(path, array, allow_pickle=False)


def perturb_constant_params(model, gen):
    """Add PERTURB * N(0, 1) to every parameter initialized to a constant
    or to almost zero (LayerNorm / RMSNorm / BatchNorm weights 1 and biases
    0, Linear biases 0, ViT's class token and zero-initialized head, its
    MLP biases of std 1e-6): a constant hides a wrong transpose or
    broadcast, and ViT's zero head would zero every other gradient."""
    names = []
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.numel() > 1 and (bool(p.min() == p.max()) or float(p.abs().max()) < 1e-4):
                p.add_(PERTURB * torch.randn(p.shape, generator=gen, dtype=p.dtype))
                names.append(name)
    return names


def warm_up_batchnorm(model, sample, batch, gen):
    """Give the BatchNorm running statistics realistic values (not 0 / 1):
    one train-mode forward of a batch of 4 * batch rows with momentum 1, so
    the running statistics are that batch's (the steps' running-statistics
    references start from them)."""
    bns = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    if not bns:
        return False
    saved = [m.momentum for m in bns]
    for m in bns:
        m.momentum = 1.0
    model.train()
    with torch.no_grad():
        model(*sample(gen, 4 * batch).values())
    for m, mom in zip(bns, saved):
        m.momentum = mom
        m.num_batches_tracked.zero_()
    return True


class Float64Mode(TorchFunctionMode):
    """For the float64 references: every float32 request becomes float64.

    transformers computes some parts in float32 whatever the model's dtype
    (LlamaRMSNorm: hidden_states.to(torch.float32); the rotary embedding:
    inv_freq.float() @ position_ids.float()), so model.double() alone is
    not float64 throughout. Under this mode Tensor.float() is .double() and
    any torch.float32 argument is torch.float64; float32_results counts the
    float32 tensors still produced (must be 0)."""

    def __init__(self):
        super().__init__()
        self.float32_results = 0
        self.rewritten = collections.Counter()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", str(func))
        if func is torch.Tensor.float:
            func = torch.Tensor.double
            self.rewritten[name] += 1

        def fix(a):
            if a is torch.float32:
                self.rewritten[name] += 1
                return torch.float64
            return a
        args = tree_map(fix, args)
        kwargs = tree_map(fix, kwargs)
        out = func(*args, **kwargs)
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.dtype == torch.float32:
                self.float32_results += 1
        return out


def precision(dtype):
    """The context a reference computation in dtype runs under."""
    return Float64Mode() if dtype == torch.float64 else contextlib.nullcontext()


def parse_graph_signature(text):
    """pkg.torch.export.ExportedProgram.graph_signature -> (inputs, outputs),
    lists of (placeholder, kind, target or None, persistent or None)."""
    sections = {"inputs": [], "outputs": []}
    cur = None
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        if line.startswith("# "):
            cur = line[2:]
            continue
        mt = re.match(r"^(\S+): ([A-Z_]+)(?: target='([^']*)')?(?: persistent=(\w+))?$", line)
        if not mt or cur not in sections:
            raise SystemExit("graph_signature: cannot parse %r" % line)
        sections[cur].append(mt.groups())
    return sections["inputs"], sections["outputs"]


def map_params(wrapped, graph, signature):
    """{parameter name (named_parameters, tied ones once): initializer name},
    [notes]. A parameter is found under one of its names (a tied weight has
    several: the legacy exporter keeps the first, the dynamo exporter the
    last); else by value. With a graph signature (dynamo), every PARAMETER
    target is checked to be a module path."""
    inits = collections.OrderedDict((i.name, i) for i in graph.initializer)
    aliases = collections.OrderedDict()
    for name, p in wrapped.named_parameters(remove_duplicate=False):
        aliases.setdefault(id(p), []).append(name)
    mapping, notes = collections.OrderedDict(), []
    for name, p in wrapped.named_parameters():
        names = aliases[id(p)]
        hits = [n for n in names if n in inits]
        if len(hits) == 1:
            mapping[name] = hits[0]
            if len(names) > 1:
                notes.append("tied parameter %s exported once, as initializer %s" % (
                    " = ".join(names), hits[0]))
            continue
        if len(hits) > 1:
            raise SystemExit("parameter %s: several initializers %s" % (name, hits))
        want = p.detach().numpy()
        hits = [i.name for i in graph.initializer
                if tuple(i.dims) == want.shape and i.data_type == onnx.TensorProto.FLOAT
                and np.array_equal(onnx.numpy_helper.to_array(i), want)]
        if len(hits) != 1:
            raise SystemExit("parameter %s: %d matching initializers %s" % (name, len(hits), hits))
        mapping[name] = hits[0]
        notes.append("parameter %s exported as initializer %s" % (name, hits[0]))
    if signature is not None:
        sig_inputs, _ = signature
        targets = [t for _, kind, t, _ in sig_inputs if kind == "PARAMETER"]
        all_names = [n for ns in aliases.values() for n in ns]
        assert sorted(targets) == sorted(all_names), (targets, all_names)
        for pname, init in mapping.items():
            assert init in targets, (pname, init)
    return mapping, notes


def initializer_kinds(graph):
    """{initializer: InputSpec.kind} from the dynamo exporter's value_info
    metadata (pkg.torch.export.graph_signature.InputSpec.kind)."""
    inits = {i.name for i in graph.initializer}
    kinds = {}
    for v in graph.value_info:
        meta = {kv.key: kv.value for kv in v.metadata_props}
        kind = meta.get("pkg.torch.export.graph_signature.InputSpec.kind")
        if v.name in inits and kind is not None:
            kinds[v.name] = kind
    assert set(kinds) == inits, sorted(inits - set(kinds))
    return kinds


def batchnorm_modes(graph):
    """[training_mode of every BatchNormalization node] (0 when absent)."""
    modes = []
    for n in graph.node:
        if n.op_type == "BatchNormalization":
            a = {x.name: x for x in n.attribute}
            modes.append(int(a["training_mode"].i) if "training_mode" in a else 0)
    return modes


def prepare(wrapped, graph, bn_eval):
    """A copy of wrapped for the references of this export: buffers set to
    the initializer values of model.onnx where it has them (the legacy
    exporter's train-mode tracing pass updated the BatchNorm statistics it
    wrote), and BatchNorm in eval() mode where the graph's is inference."""
    m = copy.deepcopy(wrapped)
    inits = {i.name: i for i in graph.initializer}
    changed = []
    with torch.no_grad():
        for name, b in m.named_buffers():
            if name in inits:
                a = torch.from_numpy(onnx.numpy_helper.to_array(inits[name]).copy())
                assert a.shape == b.shape, name
                if not torch.equal(a.to(b.dtype), b):
                    changed.append(name)
                b.copy_(a.to(b.dtype))
    m.train()
    if bn_eval:
        for mod in m.modules():
            if isinstance(mod, nn.modules.batchnorm._BatchNorm):
                mod.eval()
    return m, changed


def set_mode(m, bn_eval):
    m.train()
    if bn_eval:
        for mod in m.modules():
            if isinstance(mod, nn.modules.batchnorm._BatchNorm):
                mod.eval()


def autograd(model, inputs, dtype, bn_eval):
    m = copy.deepcopy(model).to(dtype)
    set_mode(m, bn_eval)
    args = [t.to(dtype) if t.is_floating_point() else t for t in inputs.values()]
    m.zero_grad()
    with precision(dtype) as mode:
        loss = m(*args)
        loss.backward()
    check_precision(mode)
    grads = collections.OrderedDict(
        (n, p.grad.detach().clone()) for n, p in m.named_parameters())
    for n, g in grads.items():
        assert g.dtype == dtype, (n, g.dtype)
    return loss.detach(), grads, (dict(mode.rewritten) if mode is not None else {})


def check_precision(mode):
    if mode is not None and mode.float32_results:
        raise SystemExit("float64 reference: %d float32 results" % mode.float32_results)


def multi_step(model, data, batch, dtype, bn_eval):
    m = copy.deepcopy(model).to(dtype)
    set_mode(m, bn_eval)
    opt = torch.optim.SGD(m.parameters(), lr=STEPS_LR, momentum=STEPS_MOMENTUM,
                          nesterov=False, weight_decay=0)
    losses = []
    for s in range(STEPS):
        opt.zero_grad()
        step_losses = []
        for mb in range(MICROBATCHES):
            rows = slice((s * MICROBATCHES + mb) * batch, (s * MICROBATCHES + mb + 1) * batch)
            args = [t[rows].to(dtype) if t.is_floating_point() else t[rows]
                    for t in data.values()]
            with precision(dtype) as mode:
                loss = m(*args)
                (loss / MICROBATCHES).backward()
            check_precision(mode)
            step_losses.append(float(loss.detach()))
        losses.append(sum(step_losses) / MICROBATCHES)
        opt.step()
    params = collections.OrderedDict((n, p.detach().clone()) for n, p in m.named_parameters())
    bufs = collections.OrderedDict()
    for n, mod in m.named_modules():
        if isinstance(mod, nn.modules.batchnorm._BatchNorm):
            for suffix in ("running_mean", "running_var"):
                bufs[n + "." + suffix] = getattr(mod, suffix).detach().to(torch.float32).numpy()
    return params, losses, bufs


def export(exporter, wrapped, inputs, path, optimize=False):
    args = tuple(inputs.values())
    names = list(inputs.keys())
    model = copy.deepcopy(wrapped)
    model.train()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if exporter == "dynamo":
            torch.onnx.export(model, args, path, dynamo=True, optimize=optimize,
                              external_data=False, input_names=names,
                              output_names=["loss"], verbose=False)
        else:
            torch.onnx.export(model, args, path, dynamo=False, opset_version=LEGACY_OPSET,
                              training=torch.onnx.TrainingMode.TRAINING,
                              do_constant_folding=False, input_names=names,
                              output_names=["loss"])
    m = onnx.load(path)
    renamed = None
    if [o.name for o in m.graph.output] != ["loss"]:
        # Rename the single output to `loss` (its producer and readers too).
        assert len(m.graph.output) == 1, [o.name for o in m.graph.output]
        old = m.graph.output[0].name
        for n in m.graph.node:
            n.output[:] = ["loss" if x == old else x for x in n.output]
            n.input[:] = ["loss" if x == old else x for x in n.input]
        m.graph.output[0].name = "loss"
        onnx.save(m, path)
        renamed = old
    onnx.checker.check_model(path, full_check=True)
    return onnx.load(path), renamed


def ort_loss(path, inputs):
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.intra_op_num_threads = 1
    so.log_severity_level = 3
    try:
        sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        out = sess.run(["loss"], {k: v.numpy() for k, v in inputs.items()})
        return float(np.asarray(out[0])), None
    except Exception as e:  # noqa: BLE001
        return None, "%s: %s" % (type(e).__name__, str(e).splitlines()[0][:300])


def histogram(graph):
    h = collections.Counter(
        (n.domain + "::" if n.domain not in ("", "ai.onnx") else "") + n.op_type
        for n in graph.node)
    return collections.OrderedDict(sorted(h.items()))


def node_metadata_keys(graph):
    keys = collections.OrderedDict()
    for n in graph.node:
        for kv in n.metadata_props:
            keys[kv.key] = keys.get(kv.key, 0) + 1
    return keys


def folder_size(folder):
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(folder) for f in fs)


def build_export(name, exporter, wrapped, inputs, data, batch, bn_present):
    folder = os.path.join(HERE, "%s-%s" % (name, exporter))
    if os.path.exists(folder):
        shutil.rmtree(folder)
    os.makedirs(folder)
    path = os.path.join(folder, "model.onnx")
    mo, renamed = export(exporter, wrapped, inputs, path)
    graph = mo.graph
    notes = []
    if renamed:
        notes.append("graph output %r renamed to 'loss'" % renamed)
    ext = [f for f in os.listdir(folder) if f != "model.onnx"]
    assert not ext, ext   # external_data=False / legacy: weights inline

    sig_text = {kv.key: kv.value for kv in graph.metadata_props}.get(
        "pkg.torch.export.ExportedProgram.graph_signature")
    signature = parse_graph_signature(sig_text) if sig_text is not None else None
    assert (signature is not None) == (exporter == "dynamo"), exporter

    mapping, map_notes = map_params(wrapped, graph, signature)
    notes += map_notes
    param_inits = set(mapping.values())
    assert len(param_inits) == len(mapping), "two parameters share an initializer"
    if exporter == "dynamo":
        mismatch = [(p, i) for p, i in mapping.items() if p != i]
        if mismatch:
            notes.append("dynamo initializer names that are not the named_parameters() "
                         "name: %s" % mismatch)

    modes = batchnorm_modes(graph)
    assert all(modes) or not any(modes), modes
    # The references are the module's train() semantics, always. The dynamo
    # exporter writes a train()-mode BatchNorm in inference form (no
    # training_mode, 1 output) and records its running statistics as
    # BUFFER_MUTATION outputs of the signature, which cleave reads.
    bn_eval = False
    if modes and not all(modes):
        mutated = set(re.findall(r"BUFFER_MUTATION target='([^']*)'", sig_text or ""))
        bn_inputs = [n.input[3] for n in graph.node if n.op_type == "BatchNormalization"]
        assert all(b in mutated for b in bn_inputs), "an inference BatchNorm without mutation"
        notes.append("the graph's %d BatchNormalization nodes are in inference form "
                     "(no training_mode, 1 output); the signature lists their running "
                     "statistics as BUFFER_MUTATION (the module ran in train()); "
                     "references use train() BatchNorm" % len(modes))
    assert bool(modes) == bn_present or not bn_present, (modes, bn_present)

    base, changed = prepare(wrapped, graph, bn_eval)
    if changed:
        notes.append("%d buffers in model.onnx differ from the module's before export "
                     "(the exporter's tracing forward updated them); references start "
                     "from the exported values" % len(changed))

    # The exported parameter values are the module's.
    params = dict(wrapped.named_parameters())
    inv = {v: k for k, v in mapping.items()}
    for i in graph.initializer:
        if i.name in param_inits:
            assert i.data_type == onnx.TensorProto.FLOAT, i.name
            assert np.array_equal(onnx.numpy_helper.to_array(i),
                                  params[inv[i.name]].detach().numpy()), i.name
    init_names = [i.name for i in graph.initializer]
    graph_inputs = [i for i in graph.input if i.name not in set(init_names)]
    assert [i.name for i in graph_inputs] == list(inputs.keys()), [i.name for i in graph_inputs]
    for gi in graph_inputs:
        t = inputs[gi.name]
        dims = [d.dim_value for d in gi.type.tensor_type.shape.dim]
        assert dims == list(t.shape), (gi.name, dims, t.shape)
        want = {torch.float32: onnx.TensorProto.FLOAT, torch.int64: onnx.TensorProto.INT64}[t.dtype]
        assert gi.type.tensor_type.elem_type == want, gi.name
    assert [o.name for o in graph.output] == ["loss"]
    out_dims = graph.output[0].type.tensor_type.shape.dim
    assert len(out_dims) == 0, out_dims
    buffers = [n for n in init_names if n not in param_inits]
    buffer_names = {n for n, _ in wrapped.named_buffers()}
    aliases = collections.defaultdict(list)
    for n, p in wrapped.named_parameters(remove_duplicate=False):
        aliases[id(p)].append(n)
    if exporter == "dynamo":
        # The dynamo exporter also marks each initializer by a value_info
        # entry of its name, metadata InputSpec.kind PARAMETER / BUFFER.
        kinds = initializer_kinds(graph)
        assert sorted(n for n, k in kinds.items() if k == "PARAMETER") == sorted(param_inits), kinds
        assert sorted(n for n, k in kinds.items() if k != "PARAMETER") == sorted(buffers), kinds

    # References.
    loss32, g32, _ = autograd(base, inputs, torch.float32, bn_eval)
    loss64, g64, rewritten = autograd(base, inputs, torch.float64, bn_eval)
    if rewritten:
        notes.append("float64 reference: float32 requests made float64 (Float64Mode): %s"
                     % ", ".join("%s %d" % kv for kv in sorted(rewritten.items())))
    for k, t in inputs.items():
        a = t.numpy()
        assert a.dtype in (np.float32, np.int64), (k, a.dtype)
        save(os.path.join(folder, "inputs", k + ".npy"), a)
    save(os.path.join(folder, "reference", "loss.npy"), loss32.numpy().astype(np.float32).reshape(()))
    save(os.path.join(folder, "reference64", "loss.npy"), loss64.numpy().astype(np.float64).reshape(()))
    inits = {i.name: i for i in graph.initializer}
    for pname, init in mapping.items():
        a32 = g32[pname].numpy()
        a64 = g64[pname].numpy()
        assert a32.dtype == np.float32 and a64.dtype == np.float64
        assert a32.shape == tuple(inits[init].dims), (init, a32.shape)
        save(os.path.join(folder, "reference", "grad.%s.npy" % init), a32)
        save(os.path.join(folder, "reference64", "grad.%s.npy" % init), a64)
    with open(os.path.join(folder, "reference", "params.txt"), "w") as f:
        f.write("".join(n + "\n" for n in init_names if n in param_inits))
    with open(os.path.join(folder, "reference", "buffers.txt"), "w") as f:
        f.write("".join(n + "\n" for n in buffers))
    diffs = {pname: rel_err(g32[pname].numpy(), g64[pname].numpy()) for pname in g32}
    worst_param = max(diffs, key=diffs.get)
    # Parameters whose gradient is zero in exact arithmetic (BERT's key
    # biases: a constant added to all key scores of a query leaves the
    # softmax unchanged): float64 leaves ~1e-17, float32 ~1e-9 of noise, so
    # their relative error says nothing. Listed, and left out of the
    # second error figure.
    gmax = max(float(g.abs().max()) for g in g64.values())
    zero_grad = [pname for pname, g in g64.items() if float(g.abs().max()) < 1e-9 * gmax]
    rest = {k: v for k, v in diffs.items() if k not in zero_grad}
    worst_rest = max(rest, key=rest.get)
    if zero_grad:
        notes.append("gradient zero in exact arithmetic (float64 max |g| < 1e-9 x the "
                     "largest gradient; float32 holds rounding noise): %s" % ", ".join(
                         "%s (f64 %.1e, f32 %.1e)" % (mapping[k], float(g64[k].abs().max()),
                                                      float(g32[k].abs().max()))
                         for k in zero_grad))
    loss_diff = abs(float(loss32) - float(loss64)) / max(abs(float(loss64)), 1e-6)

    # Multi-step fixture.
    sdir = os.path.join(folder, "steps")
    p32, l32, b32 = multi_step(base, data, batch, torch.float32, bn_eval)
    p64, l64, _ = multi_step(base, data, batch, torch.float64, bn_eval)
    for k, t in data.items():
        assert t.dtype == inputs[k].dtype and t.shape[1:] == inputs[k].shape[1:], k
        save(os.path.join(sdir, "data", k + ".npy"), t.numpy())
    for pname, init in mapping.items():
        save(os.path.join(sdir, "params", init + ".npy"), p32[pname].numpy())
    save(os.path.join(sdir, "losses.npy"), np.asarray(l32, dtype=np.float32))
    for buf, a in b32.items():
        if buf in buffers:   # named by the wrapper's module path, "m. ..."
            save(os.path.join(sdir, "buffers", buf + ".npy"), a)
    with open(os.path.join(sdir, "hyper.txt"), "w") as f:
        f.write("lr %g\nmomentum %g\nmicrobatches %d\nsteps %d\nbatch %d\n" % (
            STEPS_LR, STEPS_MOMENTUM, MICROBATCHES, STEPS, batch))
    step_err, step_worst = max((rel_err(p32[n].numpy(), p64[n].numpy()), n) for n in p32)
    moved = max(rel_err(p32[n].numpy(), p.detach().numpy())
                for n, p in base.named_parameters())

    # onnxruntime reproduces the loss.
    ort_value, ort_error = ort_loss(path, inputs)
    ort_rel = (abs(ort_value - float(loss32)) / max(abs(float(loss32)), 1e-6)
               if ort_value is not None else None)

    opsets = collections.OrderedDict(
        (o.domain or "ai.onnx", o.version) for o in mo.opset_import)
    hist = histogram(graph)
    n_params = sum(p.numel() for p in wrapped.parameters())
    info = collections.OrderedDict([
        ("model", name),
        ("exporter", exporter),
        ("export_call", "torch.onnx.export(wrapped, args, path, dynamo=True, optimize=False, "
                        "external_data=False, input_names=..., output_names=['loss'])"
         if exporter == "dynamo" else
         "torch.onnx.export(wrapped, args, path, dynamo=False, opset_version=17, "
         "training=TrainingMode.TRAINING, do_constant_folding=False, input_names=..., "
         "output_names=['loss'])"),
        ("torch", torch.__version__),
        ("producer", "%s %s" % (mo.producer_name, mo.producer_version)),
        ("opset", opsets.get("ai.onnx")),
        ("opset_import", opsets),
        ("ir_version", mo.ir_version),
        ("model_bytes", os.path.getsize(path)),
        ("nodes", len(graph.node)),
        ("op_histogram", hist),
        ("non_default_domains", sorted({n.domain for n in graph.node
                                        if n.domain not in ("", "ai.onnx")})),
        ("functions", len(mo.functions)),
        ("parameters", n_params),
        ("parameter_tensors", len(mapping)),
        ("initializers", len(graph.initializer)),
        ("buffers", buffers),
        ("inputs", [collections.OrderedDict([
            ("name", k), ("shape", list(t.shape)), ("dtype", str(t.numpy().dtype))])
            for k, t in inputs.items()]),
        ("output", "loss"),
        ("batchnorm_training_mode", modes[0] if modes else None),
        ("references_batchnorm", ("eval" if bn_eval else "train") if modes else None),
        ("loss", float(loss32)),
        ("loss64", float(loss64)),
        ("f32_vs_f64_loss_rel", loss_diff),
        ("f32_vs_f64_max_grad_rel_err", diffs[worst_param]),
        ("f32_vs_f64_worst_param", mapping[worst_param]),
        ("zero_gradient_params", [mapping[k] for k in zero_grad]),
        ("f32_vs_f64_max_grad_rel_err_nonzero", rest[worst_rest]),
        ("f32_vs_f64_worst_nonzero_param", mapping[worst_rest]),
        ("steps_losses", [float(v) for v in l32]),
        ("steps_f32_vs_f64_max_param_rel_err", step_err),
        ("onnxruntime_loss", ort_value),
        ("onnxruntime_loss_rel_err", ort_rel),
        ("onnxruntime_error", ort_error),
        # Every parameter initializer is named by a module path of its
        # parameter (for a tied one, one of its paths), every other
        # initializer by a buffer's path.
        ("initializer_names_are_module_paths", all(
            i in aliases[id(params[p])] for p, i in mapping.items()) and all(
            b in buffer_names for b in buffers)),
        ("tied_parameters", collections.OrderedDict(
            (i, aliases[id(params[p])]) for p, i in mapping.items()
            if len(aliases[id(params[p])]) > 1)),
        ("node_metadata_keys", node_metadata_keys(graph)),
        ("graph_metadata_keys", [kv.key for kv in graph.metadata_props]),
        ("notes", notes),
    ])
    with open(os.path.join(folder, "info.json"), "w") as f:
        json.dump(info, f, indent=1)
        f.write("\n")

    print("%s-%s: opset %s, IR %d, %d nodes, %d params in %d tensors, model.onnx %d B, folder %d B" % (
        name, exporter, info["opset"], mo.ir_version, len(graph.node), n_params, len(mapping),
        os.path.getsize(path), folder_size(folder)))
    print("  ops: " + ", ".join("%s %d" % kv for kv in hist.items()))
    print("  loss %.6f; f32 vs f64: loss rel %.2e, max grad rel err %.2e (%s)%s" % (
        float(loss32), loss_diff, diffs[worst_param], mapping[worst_param],
        "; %.2e (%s) without the %d zero-gradient tensors" % (
            rest[worst_rest], mapping[worst_rest], len(zero_grad)) if zero_grad else ""))
    print("  onnxruntime: " + ("loss %.6f, rel err %.2e" % (ort_value, ort_rel)
                               if ort_value is not None else "FAILED " + ort_error))
    print("  steps: losses %s; params moved (rel) %.2e; f32 vs f64 max param rel err %.2e (%s)" % (
        " ".join("%.6f" % v for v in l32), moved, step_err, mapping[step_worst]))
    print("  buffers: %s" % (", ".join(buffers) if len(buffers) <= 6 else
                             "%d (%s, ...)" % (len(buffers), ", ".join(buffers[:4]))))
    for n in notes:
        print("  note: " + n)
    return info


def build_folded(name, wrapped, inputs, expected_loss):
    folder = os.path.join(HERE, "%s-dynamo-folded" % name)
    if os.path.exists(folder):
        shutil.rmtree(folder)
    os.makedirs(folder)
    path = os.path.join(folder, "model.onnx")
    mo, renamed = export("dynamo", wrapped, inputs, path, optimize=True)
    assert os.listdir(folder) == ["model.onnx"], os.listdir(folder)
    ort_value, ort_error = ort_loss(path, inputs)
    hist = histogram(mo.graph)
    # Parameters the optimizer folded away (no initializer of their name).
    sig = {kv.key: kv.value for kv in mo.graph.metadata_props}[
        "pkg.torch.export.ExportedProgram.graph_signature"]
    inits = {i.name for i in mo.graph.initializer}
    targets = [t for _, kind, t, _ in parse_graph_signature(sig)[0] if kind == "PARAMETER"]
    aliases = collections.OrderedDict()
    for n, p in wrapped.named_parameters(remove_duplicate=False):
        aliases.setdefault(id(p), []).append(n)
    assert sorted(targets) == sorted(n for ns in aliases.values() for n in ns)
    missing = [" = ".join(ns) for ns in aliases.values() if not any(n in inits for n in ns)]
    others = sorted(inits - set(targets))
    opsets = {(o.domain or "ai.onnx"): o.version for o in mo.opset_import}
    info = {"model": name, "exporter": "dynamo-folded", "opset": opsets.get("ai.onnx"),
            "ir_version": mo.ir_version, "op_histogram": hist, "nodes": len(mo.graph.node),
            "initializers": len(mo.graph.initializer), "model_bytes": os.path.getsize(path),
            "onnxruntime_loss": ort_value, "onnxruntime_error": ort_error,
            "onnxruntime_loss_rel_err": (abs(ort_value - expected_loss) / abs(expected_loss)
                                         if ort_value is not None else None)}
    print("%s-dynamo-folded: opset %s, IR %d, %d nodes, %d initializers, model.onnx %d B" % (
        name, info["opset"], mo.ir_version, len(mo.graph.node), len(mo.graph.initializer),
        os.path.getsize(path)))
    print("  ops: " + ", ".join("%s %d" % kv for kv in hist.items()))
    print("  parameters with no initializer (folded away): %s; %d initializers "
          "that are not parameters (%s, ...)" % (", ".join(missing) or "none", len(others),
                                                ", ".join(others[:6])))
    info["folded_parameters"] = missing
    print("  onnxruntime: " + ("loss %.6f, rel err %.2e vs the %s-dynamo reference" % (
        ort_value, info["onnxruntime_loss_rel_err"], name) if ort_value is not None
        else "FAILED " + ort_error))
    return info


def build_model(index, name):
    make, batch = MODELS[name]
    torch.manual_seed(MODEL_SEED + index)
    gen = torch.Generator().manual_seed(MODEL_SEED + index)
    module, sample, wrapper = make()
    perturbed = perturb_constant_params(module, gen)
    wrapped = wrapper(module)
    bn = warm_up_batchnorm(wrapped, sample, batch, gen)
    wrapped.train()
    inputs = sample(torch.Generator().manual_seed(INPUT_SEED + index), batch)
    data = sample(torch.Generator().manual_seed(STEPS_SEED + index), STEPS * MICROBATCHES * batch)
    print("== %s: %s, %d parameters; perturbed %d constant-initialized tensors%s" % (
        name, type(module).__module__ + "." + type(module).__name__,
        sum(p.numel() for p in module.parameters()), len(perturbed),
        "; BatchNorm statistics warmed up" if bn else ""))
    results = []
    for exporter in EXPORTERS:
        if exporter != "dynamo" and name in DYNAMO_ONLY:
            continue
        try:
            results.append(build_export(name, exporter, wrapped, inputs, data, batch, bn))
        except Exception as e:  # noqa: BLE001
            if isinstance(e, (AssertionError, SystemExit)):
                raise
            folder = os.path.join(HERE, "%s-%s" % (name, exporter))
            shutil.rmtree(folder, ignore_errors=True)
            msg = "%s: %s" % (type(e).__name__, str(e).strip().splitlines()[-1][:400])
            print("%s-%s: EXPORT FAILED %s" % (name, exporter, msg))
            results.append({"model": name, "exporter": exporter, "failed": msg})
    if name in ("gpt2", "resnet18"):
        # The default optimize=True: GPT-2's parameters folded into unnamed
        # constants, ResNet's train()-mode BatchNorms dropped.
        ref = next(r for r in results if r.get("exporter") == "dynamo")
        results.append(build_folded(name, wrapped, inputs, ref["loss"]))
    return results


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="", help="comma-separated models (default: all of %s)"
                    % ", ".join(MODELS))
    args = ap.parse_args()
    names = [n for n in args.only.split(",") if n] or list(MODELS)
    for n in names:
        if n not in MODELS:
            ap.error("unknown model %r (have %s)" % (n, ", ".join(MODELS)))
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    results = []
    for n in names:
        results += build_model(list(MODELS).index(n), n)

    print()
    print("| export | opset | IR | nodes | params | model.onnx | loss | f32-vs-f64 grad* | ORT loss rel | BN refs |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        label = "%s-%s" % (r["model"], r["exporter"])
        if "failed" in r:
            print("| %s | FAILED: %s |" % (label, r["failed"]))
            continue
        ort = ("%.1e" % r["onnxruntime_loss_rel_err"]) if r.get("onnxruntime_loss") is not None \
            else "ORT failed"
        print("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            label, r["opset"], r["ir_version"], r["nodes"], r.get("parameters", "-"),
            r["model_bytes"], ("%.6f" % r["loss"]) if "loss" in r else "-",
            ("%.1e" % r["f32_vs_f64_max_grad_rel_err_nonzero"]) if "loss" in r else "-", ort,
            r.get("references_batchnorm") or "-"))
    total = sum(folder_size(os.path.join(HERE, d)) for d in os.listdir(HERE)
                if os.path.isdir(os.path.join(HERE, d)))
    print("* max over parameters, zero-gradient tensors (info.json zero_gradient_params) left out")
    print("corpus folders: %d bytes" % total)
    bad = [r for r in results if "failed" not in r and
           (r.get("onnxruntime_loss") is None or r["onnxruntime_loss_rel_err"] > 1e-5)]
    if bad:
        print("WARNING: onnxruntime does not reproduce the loss to 1e-5 for: " +
              ", ".join("%s-%s" % (r["model"], r["exporter"]) for r in bad))


if __name__ == "__main__":
    main()
