"""The sweep's model registry: small random-init configurations of library
classes, each wrapped to return its loss.

transformers: a generic shrinker builds each class's config with small sizes
(hidden 32, 2 layers, 4 heads, 2 KV heads, FFN 64, vocab 128, 64 positions,
32x32 images, every dropout 0) wherever the class's default config has the
attribute with an int or float value, then applies the entry's overrides.
The model's own loss comes through `labels=` (causal and masked LM, sequence
and image classification, seq2seq LM, CTC, semantic segmentation).

timm: one small architecture of each model family (timm.create_model, 64x64
images, depth or widths cut where the family takes them).

torchvision: the classification and segmentation builders at small widths
(rebuilt from the library's own blocks where the builder hard-codes them),
32x32 images (64 where the network needs them), `F.cross_entropy` losses
(per pixel on the 'out' head for segmentation).

torch.nn losses: each of PyTorch's loss modules (and torchvision's focal
loss) in the option sets people use, on a two-layer network whose heads
feed the loss (`loss_entries`). torch.nn layers: one small network around
each layer the other families do not exercise as a user writes it
(`layer_entries`).

Every entry's build() returns (module, sample, wrapper, batch): sample(gen, n)
draws an OrderedDict of n input rows, wrapper(module) is the nn.Module whose
forward takes those inputs in that order and returns the scalar loss.
"""

import collections
import functools

import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB = 128
SEQ = 16
TGT = 8
IMAGE = 32
CLASSES = 10
PERTURB = 0.1

Entry = collections.namedtuple("Entry", "name family cls build")


# --------------------------------------------------------------------------
# Common preparation

def perturb_constant_params(model, gen):
    """PERTURB * N(0, 1) added to every parameter initialized to a constant
    or almost zero (norm weights and biases, zero biases and heads): a
    constant hides a misplaced transpose or broadcast, and a zero head
    zeroes every other gradient (the corpus does the same)."""
    names = []
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.numel() > 1 and (bool(p.min() == p.max()) or float(p.abs().max()) < 1e-4):
                p.add_(PERTURB * torch.randn(p.shape, generator=gen, dtype=p.dtype))
                names.append(name)
            elif p.numel() == 1 and float(p.abs()) < 1e-4:
                p.add_(PERTURB * torch.randn(p.shape, generator=gen, dtype=p.dtype))
                names.append(name)
    return names


def warm_up_batchnorm(model, sample, batch, gen):
    """Running statistics set to one batch's (momentum 1), so they are not
    the 0 / 1 of a fresh module."""
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
        if m.num_batches_tracked is not None:
            m.num_batches_tracked.zero_()
    return True


def no_dropout(model):
    """Every dropout probability 0 (the config's or the builder's)."""
    for m in model.modules():
        if isinstance(m, nn.modules.dropout._DropoutNd):
            m.p = 0.0
        for attr in ("drop_prob", "dropout_prob", "stochastic_depth_prob"):
            if isinstance(getattr(m, attr, None), float):
                setattr(m, attr, 0.0)
        if type(m).__name__ == "StochasticDepth":
            m.p = 0.0


# --------------------------------------------------------------------------
# transformers

# Attribute -> small value; set only where the class's default config has
# the attribute with a value of the same type (int / float), so lists and
# None defaults keep their meaning.
SHRINK = {
    "vocab_size": VOCAB, "hidden_size": 32, "d_model": 32, "n_embd": 32, "dim": 32,
    "embedding_size": 32, "word_embed_proj_dim": 32, "embed_dim": 32,
    "num_hidden_layers": 2, "n_layer": 2, "num_layers": 2, "n_layers": 2,
    "encoder_layers": 2, "decoder_layers": 2, "num_decoder_layers": 2,
    "num_attention_heads": 4, "n_head": 4, "n_heads": 4, "num_heads": 4,
    "encoder_attention_heads": 4, "decoder_attention_heads": 4,
    "num_key_value_heads": 2, "num_kv_heads": 2,
    "intermediate_size": 64, "ffn_dim": 64, "encoder_ffn_dim": 64, "decoder_ffn_dim": 64,
    "d_ff": 64, "hidden_dim": 64, "d_kv": 8, "head_dim": 8,
    "max_position_embeddings": 64, "n_positions": 64, "n_ctx": 64, "max_target_positions": 64,
    "num_experts": 4, "num_local_experts": 4, "num_experts_per_tok": 2,
    "moe_intermediate_size": 32, "shared_expert_intermediate_size": 32,
    "image_size": IMAGE, "patch_size": 8, "num_channels": 3,
    "rotary_dim": 4, "relative_attention_num_buckets": 8,
    "relative_attention_max_distance": 16, "state_size": 8, "expand": 2,
    "conv_kernel": 4, "time_step_rank": 4, "num_buckets": 8,
    "initializer_range": 0.05,
}

DROPOUT_WORDS = ("dropout", "pdrop", "drop_path", "layerdrop", "drop_rate")
DROP = object()   # an override that removes a shrunk attribute


def attribute(cfg, k):
    """cfg.k, or MISSING where the config has none or refuses one global
    value (a per-layer attribute of Gemma 4's layer configs)."""
    try:
        return getattr(cfg, k)
    except Exception:
        return MISSING


MISSING = object()


def shrunk_config(config_cls, overrides):
    base = config_cls()
    kw = {}
    for k, v in SHRINK.items():
        if isinstance(getattr(config_cls, k, None), property):
            continue   # derived (FalconConfig.head_dim)
        if attribute(base, k) is not MISSING:
            d = getattr(base, k)
            if isinstance(d, bool) or d is None:
                continue
            if isinstance(d, int) and isinstance(v, int):
                kw[k] = v
            elif isinstance(d, float) and isinstance(v, (int, float)):
                kw[k] = float(v)
    for k, d in vars(base).items():
        if any(w in k for w in DROPOUT_WORDS) and isinstance(d, float):
            kw[k] = 0.0
        if k.endswith("_token_id") and isinstance(d, int) and not isinstance(d, bool) \
                and d >= VOCAB:
            kw[k] = 1 if "pad" not in k else 0
    kw["num_labels"] = CLASSES
    kw.update(overrides)
    kw = {k: v for k, v in kw.items() if v is not DROP}
    cfg = config_cls(**kw)
    for k, v in overrides.items():   # attributes the constructor does not take
        # (a dict for a sub-config, as CLIP's vision_config, the
        # constructor made into that config)
        if isinstance(v, dict) and hasattr(attribute(cfg, k), "to_dict"):
            continue
        if v is not DROP and attribute(cfg, k) != v:
            setattr(cfg, k, v)
    if hasattr(cfg, "use_cache"):
        cfg.use_cache = False
    # Mixture-of-experts layers default to torch._grouped_mm, which has no
    # float64 kernel (the reference); the eager loop over experts is the
    # same computation. An entry may name another (batched_mm: every
    # token's chosen experts' weights gathered, batched products).
    if hasattr(cfg, "_experts_implementation_internal"):
        cfg._experts_implementation_internal = overrides.get(
            "experts_implementation", "eager")
    return cfg


class HFLoss(nn.Module):
    """forward(*inputs) -> self.m(**{name: input}, **extra).loss"""

    def __init__(self, m, names, extra=None):
        super().__init__()
        self.m = m
        self.names = list(names)
        self.extra = dict(extra or {})

    def forward(self, a, b=None, c=None, d=None):
        vals = [a, b, c, d][:len(self.names)]
        return self.m(**dict(zip(self.names, vals)), **self.extra).loss


def ids(gen, n, length=SEQ, low=4):
    return torch.randint(low, VOCAB, (n, length), generator=gen, dtype=torch.int64)


def causal_sample(gen, n, mask=True):
    x = ids(gen, n)
    d = collections.OrderedDict([("input_ids", x)])
    if mask:
        d["attention_mask"] = torch.ones(n, SEQ, dtype=torch.int64)
    d["labels"] = x.clone()
    return d


def masked_sample(gen, n, mask=True):
    x = ids(gen, n)
    lengths = torch.randint(SEQ - 4, SEQ + 1, (n,), generator=gen)
    m = (torch.arange(SEQ)[None, :] < lengths[:, None]).to(torch.int64)
    x = torch.where(m.bool(), x, torch.zeros_like(x))
    pick = torch.rand(n, SEQ, generator=gen) < 0.25
    pick[:, 1] = True
    pick &= m.bool()
    labels = torch.where(pick, ids(gen, n), torch.full_like(x, -100))
    d = collections.OrderedDict([("input_ids", x)])
    if mask:
        d["attention_mask"] = m
    else:
        d["input_ids"] = torch.where(m.bool(), x, ids(gen, n))
    d["labels"] = labels
    return d


def seqcls_sample(gen, n, mask=True):
    d = collections.OrderedDict([("input_ids", ids(gen, n))])
    if mask:
        d["attention_mask"] = torch.ones(n, SEQ, dtype=torch.int64)
    d["labels"] = torch.randint(0, CLASSES, (n,), generator=gen, dtype=torch.int64)
    return d


def seq2seq_sample(gen, n, mask=True):
    d = collections.OrderedDict([("input_ids", ids(gen, n))])
    if mask:
        d["attention_mask"] = torch.ones(n, SEQ, dtype=torch.int64)
    d["labels"] = ids(gen, n, TGT)
    return d


def image_sample(gen, n, size=IMAGE, key="pixel_values"):
    return collections.OrderedDict([
        (key, torch.randn(n, 3, size, size, generator=gen)),
        ("labels", torch.randint(0, CLASSES, (n,), generator=gen, dtype=torch.int64))])


def segment_sample(gen, n, size=IMAGE, key="pixel_values", classes=CLASSES):
    return collections.OrderedDict([
        (key, torch.randn(n, 3, size, size, generator=gen)),
        ("labels", torch.randint(0, classes, (n, size, size), generator=gen,
                                 dtype=torch.int64))])


AUDIO_SAMPLES = 1600


def ctc_sample(gen, n):
    return collections.OrderedDict([
        ("input_values", torch.randn(n, AUDIO_SAMPLES, generator=gen)),
        ("labels", torch.randint(1, 30, (n, 6), generator=gen, dtype=torch.int64))])


def features_sample(gen, n, key, shape):
    return collections.OrderedDict([
        (key, torch.randn((n,) + tuple(shape), generator=gen)),
        ("labels", ids(gen, n, TGT))])


TASKS = {
    # task: (sample, wrapper extra kwargs, batch)
    "causal": (causal_sample, {"use_cache": False}, 2),
    "causal-nocache": (causal_sample, {}, 2),
    "masked": (masked_sample, {}, 2),
    "seqcls": (seqcls_sample, {}, 2),
    "seq2seq": (seq2seq_sample, {"use_cache": False}, 2),
    "image": (image_sample, {}, 2),
    "segment": (segment_sample, {}, 2),
    "ctc": (ctc_sample, {}, 2),
}


def hf_entry(name, config, model, task, overrides=None, mask=True, batch=None,
             sample=None, extra=None):
    def build():
        import transformers
        cfg = shrunk_config(getattr(transformers, config), overrides or {})
        m = getattr(transformers, model)(cfg)
        samp, ext, b = TASKS[task]
        if sample is not None:
            samp = sample
        elif task in ("causal", "causal-nocache", "masked", "seqcls", "seq2seq"):
            samp = functools.partial(samp, mask=mask)
        ext = dict(ext)
        ext.update(extra or {})
        probe = samp(torch.Generator().manual_seed(0), 1)
        return m, samp, functools.partial(HFLoss, names=list(probe), extra=ext), batch or b
    build.hf_args = dict(config=config, model=model, task=task, overrides=overrides,
                         mask=mask, batch=batch, sample=sample, extra=extra)
    return Entry(name, "transformers", "transformers." + model, build)


# Multi-head latent attention (DeepSeek-V2 and its kin) at the sweep's
# sizes: low-rank query and key-value projections, a rotary part of each
# head beside the rest, as many KV heads as heads; two layers, the first
# dense, the second 4 routed experts and a shared one.
MLA = {"qk_nope_head_dim": 8, "qk_rope_head_dim": 8, "v_head_dim": 8, "kv_lora_rank": 16,
       "q_lora_rank": 16, "head_dim": 8, "n_routed_experts": 4, "n_shared_experts": 1,
       "first_k_dense_replace": 1, "n_group": 1, "topk_group": 1, "num_experts_per_tok": 2,
       "moe_intermediate_size": 32, "num_key_value_heads": 4}


def transformers_entries():
    E = hf_entry
    vit = {"image_size": IMAGE, "patch_size": 8}
    return [
        # decoders (labels=input_ids: the class's own shifted causal-LM loss)
        E("gpt2", "GPT2Config", "GPT2LMHeadModel", "causal"),
        E("gpt_neo", "GPTNeoConfig", "GPTNeoForCausalLM", "causal",
          {"attention_types": [[["global", "local"], 1]], "num_layers": 2, "window_size": 8}),
        E("gpt_neox", "GPTNeoXConfig", "GPTNeoXForCausalLM", "causal"),
        E("gptj", "GPTJConfig", "GPTJForCausalLM", "causal"),
        E("opt", "OPTConfig", "OPTForCausalLM", "causal"),
        E("bloom", "BloomConfig", "BloomForCausalLM", "causal"),
        E("llama", "LlamaConfig", "LlamaForCausalLM", "causal"),
        E("mistral", "MistralConfig", "MistralForCausalLM", "causal"),
        E("mixtral", "MixtralConfig", "MixtralForCausalLM", "causal"),
        E("qwen2", "Qwen2Config", "Qwen2ForCausalLM", "causal"),
        E("qwen2_moe", "Qwen2MoeConfig", "Qwen2MoeForCausalLM", "causal"),
        E("qwen3", "Qwen3Config", "Qwen3ForCausalLM", "causal"),
        E("qwen3_moe", "Qwen3MoeConfig", "Qwen3MoeForCausalLM", "causal"),
        E("phi", "PhiConfig", "PhiForCausalLM", "causal"),
        E("phi3", "Phi3Config", "Phi3ForCausalLM", "causal"),
        E("gemma", "GemmaConfig", "GemmaForCausalLM", "causal"),
        E("gemma2", "Gemma2Config", "Gemma2ForCausalLM", "causal"),
        E("gemma3", "Gemma3TextConfig", "Gemma3ForCausalLM", "causal"),
        E("falcon", "FalconConfig", "FalconForCausalLM", "causal"),
        E("stablelm", "StableLmConfig", "StableLmForCausalLM", "causal"),
        E("codegen", "CodeGenConfig", "CodeGenForCausalLM", "causal"),
        E("biogpt", "BioGptConfig", "BioGptForCausalLM", "causal"),
        E("xglm", "XGLMConfig", "XGLMForCausalLM", "causal"),
        E("mpt", "MptConfig", "MptForCausalLM", "causal"),
        E("persimmon", "PersimmonConfig", "PersimmonForCausalLM", "causal"),
        E("olmo", "OlmoConfig", "OlmoForCausalLM", "causal"),
        E("olmo2", "Olmo2Config", "Olmo2ForCausalLM", "causal"),
        E("olmoe", "OlmoeConfig", "OlmoeForCausalLM", "causal"),
        E("granite", "GraniteConfig", "GraniteForCausalLM", "causal"),
        E("cohere", "CohereConfig", "CohereForCausalLM", "causal"),
        E("gpt_bigcode", "GPTBigCodeConfig", "GPTBigCodeForCausalLM", "causal"),
        E("starcoder2", "Starcoder2Config", "Starcoder2ForCausalLM", "causal"),
        E("openai_gpt", "OpenAIGPTConfig", "OpenAIGPTLMHeadModel", "causal-nocache"),
        E("ctrl", "CTRLConfig", "CTRLLMHeadModel", "causal"),
        E("glm", "GlmConfig", "GlmForCausalLM", "causal"),
        E("glm4", "Glm4Config", "Glm4ForCausalLM", "causal"),
        E("helium", "HeliumConfig", "HeliumForCausalLM", "causal"),
        E("nemotron", "NemotronConfig", "NemotronForCausalLM", "causal", {"num_key_value_heads": 2}),
        E("smollm3", "SmolLM3Config", "SmolLM3ForCausalLM", "causal"),
        # encoders (masked LM with padded rows and -100 labels)
        E("bert", "BertConfig", "BertForMaskedLM", "masked"),
        E("bert_seqcls", "BertConfig", "BertForSequenceClassification", "seqcls"),
        E("roberta", "RobertaConfig", "RobertaForMaskedLM", "masked", {"pad_token_id": 1}),
        E("distilbert", "DistilBertConfig", "DistilBertForMaskedLM", "masked"),
        E("albert", "AlbertConfig", "AlbertForMaskedLM", "masked", {"embedding_size": 16}),
        E("electra", "ElectraConfig", "ElectraForMaskedLM", "masked", {"embedding_size": 32}),
        E("deberta", "DebertaConfig", "DebertaForMaskedLM", "masked"),
        E("deberta_v2", "DebertaV2Config", "DebertaV2ForMaskedLM", "masked"),
        E("xlm_roberta", "XLMRobertaConfig", "XLMRobertaForMaskedLM", "masked",
          {"pad_token_id": 1}),
        E("mpnet", "MPNetConfig", "MPNetForMaskedLM", "masked",
          {"pad_token_id": 1, "relative_attention_num_buckets": 32}),
        E("convbert", "ConvBertConfig", "ConvBertForMaskedLM", "masked",
          {"embedding_size": 32, "conv_kernel_size": 3}),
        E("funnel", "FunnelConfig", "FunnelForMaskedLM", "masked",
          {"block_sizes": [1, 1], "d_head": 8, "d_inner": 64, "n_head": 4,
           "num_hidden_layers": DROP}),
        E("longformer", "LongformerConfig", "LongformerForMaskedLM", "masked",
          {"attention_window": 4, "pad_token_id": 1}),
        E("big_bird", "BigBirdConfig", "BigBirdForMaskedLM", "masked",
          {"attention_type": "original_full"}),
        E("camembert", "CamembertConfig", "CamembertForMaskedLM", "masked", {"pad_token_id": 1}),
        E("megatron_bert", "MegatronBertConfig", "MegatronBertForMaskedLM", "masked"),
        E("mobilebert", "MobileBertConfig", "MobileBertForMaskedLM", "masked",
          {"embedding_size": 16, "intra_bottleneck_size": 16, "true_hidden_size": 16,
           "num_feedforward_networks": 1}),
        E("roformer", "RoFormerConfig", "RoFormerForMaskedLM", "masked"),
        E("squeezebert", "SqueezeBertConfig", "SqueezeBertForMaskedLM", "masked",
          {"embedding_size": 32}),
        E("ernie", "ErnieConfig", "ErnieForMaskedLM", "masked"),
        E("modernbert", "ModernBertConfig", "ModernBertForMaskedLM", "masked",
          {"global_attn_every_n_layers": 1, "local_attention": 8}),
        E("nystromformer", "NystromformerConfig", "NystromformerForMaskedLM", "masked",
          {"num_landmarks": 4, "segment_means_seq_len": SEQ}, mask=False),
        E("fnet", "FNetConfig", "FNetForMaskedLM", "masked", mask=False),
        E("esm", "EsmConfig", "EsmForMaskedLM", "masked", {"pad_token_id": 1, "mask_token_id": 2,
                                                           "vocab_size": VOCAB}),
        E("data2vec_text", "Data2VecTextConfig", "Data2VecTextForMaskedLM", "masked",
          {"pad_token_id": 1}),
        E("rembert", "RemBertConfig", "RemBertForMaskedLM", "masked",
          {"input_embedding_size": 16, "output_embedding_size": 16}),
        # encoder-decoders (labels: the class shifts them into decoder inputs)
        E("t5", "T5Config", "T5ForConditionalGeneration", "seq2seq", {"decoder_start_token_id": 0}),
        E("mt5", "MT5Config", "MT5ForConditionalGeneration", "seq2seq"),
        E("umt5", "UMT5Config", "UMT5ForConditionalGeneration", "seq2seq"),
        E("bart", "BartConfig", "BartForConditionalGeneration", "seq2seq"),
        E("mbart", "MBartConfig", "MBartForConditionalGeneration", "seq2seq"),
        E("pegasus", "PegasusConfig", "PegasusForConditionalGeneration", "seq2seq"),
        E("marian", "MarianConfig", "MarianMTModel", "seq2seq"),
        E("blenderbot", "BlenderbotConfig", "BlenderbotForConditionalGeneration", "seq2seq"),
        E("blenderbot_small", "BlenderbotSmallConfig",
          "BlenderbotSmallForConditionalGeneration", "seq2seq"),
        E("plbart", "PLBartConfig", "PLBartForConditionalGeneration", "seq2seq"),
        E("m2m100", "M2M100Config", "M2M100ForConditionalGeneration", "seq2seq"),
        E("switch_transformers", "SwitchTransformersConfig",
          "SwitchTransformersForConditionalGeneration", "seq2seq",
          {"num_sparse_encoder_layers": 1, "num_sparse_decoder_layers": 1,
           "decoder_start_token_id": 0}),
        # vision
        E("vit", "ViTConfig", "ViTForImageClassification", "image", vit),
        E("deit", "DeiTConfig", "DeiTForImageClassification", "image", vit),
        E("beit", "BeitConfig", "BeitForImageClassification", "image", vit),
        E("data2vec_vision", "Data2VecVisionConfig", "Data2VecVisionForImageClassification",
          "image", vit),
        E("dinov2", "Dinov2Config", "Dinov2ForImageClassification", "image", vit),
        E("vit_msn", "ViTMSNConfig", "ViTMSNForImageClassification", "image", vit),
        E("swin", "SwinConfig", "SwinForImageClassification", "image",
          {"patch_size": 4, "embed_dim": 16, "depths": [1, 1], "num_heads": [2, 2],
           "window_size": 4}),
        E("swinv2", "Swinv2Config", "Swinv2ForImageClassification", "image",
          {"patch_size": 4, "embed_dim": 16, "depths": [1, 1], "num_heads": [2, 2],
           "window_size": 4}),
        E("convnext", "ConvNextConfig", "ConvNextForImageClassification", "image",
          {"hidden_sizes": [8, 16, 32, 64], "depths": [1, 1, 1, 1], "patch_size": 4,
           "num_stages": 4}),
        E("convnextv2", "ConvNextV2Config", "ConvNextV2ForImageClassification", "image",
          {"hidden_sizes": [8, 16, 32, 64], "depths": [1, 1, 1, 1], "patch_size": 4,
           "num_stages": 4}),
        E("resnet_hf", "ResNetConfig", "ResNetForImageClassification", "image",
          {"embedding_size": 8, "hidden_sizes": [8, 16, 32, 64], "depths": [1, 1, 1, 1]}),
        E("regnet_hf", "RegNetConfig", "RegNetForImageClassification", "image",
          {"embedding_size": 8, "hidden_sizes": [8, 16, 32, 64], "depths": [1, 1, 1, 1],
           "groups_width": 8}),
        E("mobilevit", "MobileViTConfig", "MobileViTForImageClassification", "image",
          {"hidden_sizes": [16, 24, 32], "neck_hidden_sizes": [8, 8, 16, 16, 24, 24, 64],
           "patch_size": 2, "num_attention_heads": 2}),
        # Batch 4: at the image task's batch of 2, its BatchNorms over 1x1
        # maps see 2 values each and the gradient is rounding noise
        # (PyTorch float32 3.2 from float64 on a second sample, float64
        # 6e-4 from itself across implementations).
        E("mobilenet_v2_hf", "MobileNetV2Config", "MobileNetV2ForImageClassification",
          "image", {"depth_multiplier": 0.25}, batch=4),
        E("mobilenet_v1_hf", "MobileNetV1Config", "MobileNetV1ForImageClassification",
          "image", {"depth_multiplier": 0.25}),
        E("efficientnet_hf", "EfficientNetConfig", "EfficientNetForImageClassification",
          "image", {"width_coefficient": 0.25, "depth_coefficient": 0.5, "hidden_dim": 320}),
        E("segformer", "SegformerConfig", "SegformerForImageClassification", "image",
          {"hidden_sizes": [8, 16, 32, 64], "depths": [1, 1, 1, 1],
           "num_attention_heads": [1, 2, 2, 4], "decoder_hidden_size": 32}),
        E("segformer_seg", "SegformerConfig", "SegformerForSemanticSegmentation", "segment",
          {"hidden_sizes": [8, 16, 32, 64], "depths": [1, 1, 1, 1],
           "num_attention_heads": [1, 2, 2, 4], "decoder_hidden_size": 32}),
        E("poolformer", "PoolFormerConfig", "PoolFormerForImageClassification", "image",
          {"hidden_sizes": [8, 16, 32, 64], "depths": [1, 1, 1, 1]}),
        E("pvt", "PvtConfig", "PvtForImageClassification", "image",
          {"hidden_sizes": [8, 16, 32, 64], "depths": [1, 1, 1, 1],
           "num_attention_heads": [1, 2, 2, 4]}),
        E("pvt_v2", "PvtV2Config", "PvtV2ForImageClassification", "image",
          {"hidden_sizes": [8, 16, 32, 64], "depths": [1, 1, 1, 1],
           "num_attention_heads": [1, 2, 2, 4]}),
        E("levit", "LevitConfig", "LevitForImageClassification", "image",
          {"hidden_sizes": [16, 32, 48], "num_attention_heads": [1, 2, 3],
           "depths": [1, 1, 1], "key_dim": [8, 8, 8], "patch_size": 16}),
        E("focalnet", "FocalNetConfig", "FocalNetForImageClassification", "image",
          {"embed_dim": 16, "depths": [1, 1], "hidden_sizes": [16, 32], "patch_size": 4}),
        E("bit", "BitConfig", "BitForImageClassification", "image",
          {"embedding_size": 8, "hidden_sizes": [8, 16, 32, 64], "depths": [1, 1, 1, 1],
           "num_groups": 2}),
        # audio
        E("wav2vec2", "Wav2Vec2Config", "Wav2Vec2ForCTC", "ctc", AUDIO_CFG),
        E("hubert", "HubertConfig", "HubertForCTC", "ctc", AUDIO_CFG),
        E("wavlm", "WavLMConfig", "WavLMForCTC", "ctc", AUDIO_CFG),
        E("data2vec_audio", "Data2VecAudioConfig", "Data2VecAudioForCTC", "ctc", AUDIO_CFG),
        E("unispeech", "UniSpeechConfig", "UniSpeechForCTC", "ctc", AUDIO_CFG),
        E("sew", "SEWConfig", "SEWForCTC", "ctc", dict(AUDIO_CFG, squeeze_factor=2)),
        E("whisper", "WhisperConfig", "WhisperForConditionalGeneration", "seq2seq",
          {"num_mel_bins": 16, "max_source_positions": 32},
          sample=functools.partial(features_sample, key="input_features", shape=(16, 64)),
          extra={"use_cache": False}),
        E("speech_to_text", "Speech2TextConfig", "Speech2TextForConditionalGeneration",
          "seq2seq", {"input_feat_per_channel": 16, "input_channels": 1,
                      "conv_channels": 16, "max_source_positions": 64},
          sample=functools.partial(features_sample, key="input_features", shape=(32, 16)),
          extra={"use_cache": False}),
        # state-space and recurrent
        E("mamba", "MambaConfig", "MambaForCausalLM", "causal-nocache", mask=False),
        E("mamba2", "Mamba2Config", "Mamba2ForCausalLM", "causal-nocache",
          {"num_heads": 8, "head_dim": 8, "n_groups": 1, "chunk_size": 8}, mask=False),
        E("falcon_mamba", "FalconMambaConfig", "FalconMambaForCausalLM", "causal-nocache",
          mask=False),
        E("rwkv", "RwkvConfig", "RwkvForCausalLM", "causal-nocache",
          {"attention_hidden_size": 32, "intermediate_size": 64, "context_length": 64},
          mask=False),
    ]


AUDIO_CFG = {"conv_dim": [16, 16, 16], "conv_stride": [5, 4, 4], "conv_kernel": [10, 4, 4],
             "num_conv_pos_embeddings": 8, "num_conv_pos_embedding_groups": 4,
             "vocab_size": 32, "pad_token_id": 0, "ctc_loss_reduction": "mean",
             "mask_time_prob": 0.0, "mask_feature_prob": 0.0, "do_stable_layer_norm": False}


# --------------------------------------------------------------------------
# torchvision

class WithLoss(nn.Module):
    """Cross-entropy of a classifier's logits."""

    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, x, labels):
        return F.cross_entropy(self.m(x), labels)


class SegmentationWithLoss(nn.Module):
    """Per-pixel cross-entropy on the 'out' head."""

    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, x, labels):
        return F.cross_entropy(self.m(x)["out"], labels)


def tv_entry(name, make, size=IMAGE, batch=4, segment=False, cls=None):
    def build():
        m = make()
        if segment:
            samp = functools.partial(segment_sample, size=size, key="x", classes=5)
            return m, samp, SegmentationWithLoss, batch
        return m, functools.partial(image_sample, size=size, key="x"), WithLoss, batch
    return Entry(name, "torchvision", cls or "torchvision.models." + name, build)


def small_resnet(block, layers, width=8, groups=1, width_per_group=64, dilation=None,
                 strides=(1, 2, 2, 1)):
    """torchvision's ResNet rebuilt at `width` (64 in the library) with its
    own _make_layer; the last stage at stride 1 so 32x32 images keep 2x2
    maps (train-mode BatchNorm over a 1x1 map of 4 samples is ill-posed)."""
    from torchvision.models.resnet import ResNet
    m = ResNet(block, layers, num_classes=CLASSES, groups=groups,
               width_per_group=width_per_group,
               replace_stride_with_dilation=dilation)
    m.inplanes = width
    m.dilation = 1
    m.conv1 = nn.Conv2d(3, width, kernel_size=7, stride=2, padding=3, bias=False)
    m.bn1 = m._norm_layer(width)
    dil = dilation or [False, False, False]
    m.layer1 = m._make_layer(block, width, layers[0], stride=strides[0])
    m.layer2 = m._make_layer(block, 2 * width, layers[1], stride=strides[1], dilate=dil[0])
    m.layer3 = m._make_layer(block, 4 * width, layers[2], stride=strides[2], dilate=dil[1])
    m.layer4 = m._make_layer(block, 8 * width, layers[3], stride=strides[3], dilate=dil[2])
    m.fc = nn.Linear(8 * width * block.expansion, CLASSES)
    for mod in m.modules():
        if isinstance(mod, nn.Conv2d):
            nn.init.kaiming_normal_(mod.weight, mode="fan_out", nonlinearity="relu")
    return m


def tv_resnet(kind, **kw):
    from torchvision.models.resnet import BasicBlock, Bottleneck
    table = {"resnet18": (BasicBlock, [2, 2, 2, 2]), "resnet34": (BasicBlock, [3, 4, 6, 3]),
             "resnet50": (Bottleneck, [3, 4, 6, 3]), "resnet101": (Bottleneck, [3, 4, 23, 3])}
    block, layers = table[kind]
    return lambda: small_resnet(block, layers, **kw)


def tv_mobilenet_v3(arch, dilated=False):
    from torchvision.models.mobilenetv3 import MobileNetV3, _mobilenet_v3_conf
    setting, last = _mobilenet_v3_conf(arch, width_mult=0.25, dilated=dilated)
    return MobileNetV3(setting, last // 4, num_classes=CLASSES, dropout=0.0)


def tv_efficientnet(arch, scale=0.25):
    from torchvision.models.efficientnet import EfficientNet, _efficientnet_conf
    if arch.startswith("efficientnet_v2"):
        setting, last = _efficientnet_conf(arch)
        for c in setting:   # the V2 tables have fixed widths
            c.input_channels = max(8, int(c.input_channels * scale) // 8 * 8)
            c.out_channels = max(8, int(c.out_channels * scale) // 8 * 8)
            c.num_layers = 1
    else:
        setting, last = _efficientnet_conf(arch, width_mult=scale, depth_mult=0.5)
    return EfficientNet(setting, dropout=0.0, stochastic_depth_prob=0.0,
                        num_classes=CLASSES, last_channel=last // 8 if last else None)


def tv_regnet(kind):
    from torchvision.models.regnet import BlockParams, RegNet
    if kind == "y":
        params = BlockParams.from_init_params(depth=4, w_0=8, w_a=8.0, w_m=2.0,
                                              group_width=8, se_ratio=0.25)
    else:
        params = BlockParams.from_init_params(depth=4, w_0=8, w_a=8.0, w_m=2.0,
                                              group_width=8)
    return RegNet(params, num_classes=CLASSES, stem_width=8)


def tv_vgg(cfg, bn):
    from torchvision.models.vgg import VGG, make_layers
    small = [c if c == "M" else c // 8 for c in cfg]
    m = VGG(make_layers(small, batch_norm=bn), num_classes=CLASSES, init_weights=True,
            dropout=0.0)
    c = small[-2]
    m.classifier = nn.Sequential(nn.Linear(c * 49, 64), nn.ReLU(True), nn.Dropout(0.0),
                                 nn.Linear(64, 64), nn.ReLU(True), nn.Dropout(0.0),
                                 nn.Linear(64, CLASSES))
    return m


def tv_alexnet():
    import torchvision
    m = torchvision.models.alexnet(num_classes=CLASSES, dropout=0.0)
    m.classifier = nn.Sequential(nn.Dropout(0.0), nn.Linear(256 * 36, 64), nn.ReLU(True),
                                 nn.Dropout(0.0), nn.Linear(64, 64), nn.ReLU(True),
                                 nn.Linear(64, CLASSES))
    return m


def tv_convnext():
    from torchvision.models.convnext import CNBlockConfig, ConvNeXt
    setting = [CNBlockConfig(16, 32, 1), CNBlockConfig(32, 64, 1),
               CNBlockConfig(64, 128, 2), CNBlockConfig(128, None, 1)]
    return ConvNeXt(setting, stochastic_depth_prob=0.0, num_classes=CLASSES)


def tv_swin(v2=False):
    from torchvision.models import swin_transformer as st
    kw = {}
    if v2:
        kw = dict(block=st.SwinTransformerBlockV2, downsample_layer=st.PatchMergingV2)
    return st.SwinTransformer(patch_size=[4, 4], embed_dim=16, depths=[2, 2],
                              num_heads=[2, 4], window_size=[4, 4],
                              stochastic_depth_prob=0.0, num_classes=CLASSES, **kw)


def tv_segmentation(kind):
    from torchvision.models import segmentation as seg
    from torchvision.models._utils import IntermediateLayerGetter
    if kind in ("fcn_resnet50", "deeplabv3_resnet50"):
        from torchvision.models.resnet import Bottleneck
        backbone = small_resnet(Bottleneck, [3, 4, 6, 3], width=8,
                                dilation=[False, True, True], strides=(1, 2, 2, 2))
        body = IntermediateLayerGetter(backbone, {"layer4": "out"})
        ch = 8 * 8 * Bottleneck.expansion
        if kind == "fcn_resnet50":
            return seg.FCN(body, seg.fcn.FCNHead(ch, 5), None)
        return seg.DeepLabV3(body, seg.deeplabv3.DeepLabHead(ch, 5), None)
    backbone = tv_mobilenet_v3("mobilenet_v3_large", dilated=True)
    if kind == "deeplabv3_mobilenet_v3_large":
        return seg.deeplabv3._deeplabv3_mobilenetv3(backbone, 5, False)
    return seg.lraspp._lraspp_mobilenetv3(backbone, 5)


def torchvision_entries():
    import torchvision.models as tm
    T = tv_entry
    return [
        T("resnet18", tv_resnet("resnet18")),
        T("resnet34", tv_resnet("resnet34")),
        T("resnet50", tv_resnet("resnet50")),
        T("resnet101", tv_resnet("resnet101")),
        T("resnext50_32x4d", tv_resnet("resnet50", groups=4, width_per_group=16)),
        T("wide_resnet50_2", tv_resnet("resnet50", width_per_group=128)),
        T("mobilenet_v2", lambda: tm.mobilenet_v2(
            num_classes=CLASSES, width_mult=0.25, dropout=0.0, inverted_residual_setting=[
                [1, 16, 1, 1], [6, 24, 2, 1], [6, 32, 3, 1], [6, 64, 4, 2], [6, 96, 3, 1],
                [6, 160, 3, 2], [6, 320, 1, 1]])),
        T("mobilenet_v3_small", lambda: tv_mobilenet_v3("mobilenet_v3_small")),
        T("mobilenet_v3_large", lambda: tv_mobilenet_v3("mobilenet_v3_large")),
        T("shufflenet_v2_x0_5", lambda: tm.ShuffleNetV2([2, 2, 2], [8, 16, 32, 64, 128],
                                                        num_classes=CLASSES)),
        T("shufflenet_v2_x1_0", lambda: tm.ShuffleNetV2([4, 8, 4], [8, 24, 48, 96, 256],
                                                        num_classes=CLASSES)),
        T("squeezenet1_0", lambda: tm.squeezenet1_0(num_classes=CLASSES, dropout=0.0), size=64),
        T("squeezenet1_1", lambda: tm.squeezenet1_1(num_classes=CLASSES, dropout=0.0), size=64),
        T("densenet121", lambda: tm.DenseNet(growth_rate=4, block_config=(6, 12, 24, 16),
                                             num_init_features=8, num_classes=CLASSES),
          size=64),
        T("efficientnet_b0", lambda: tv_efficientnet("efficientnet_b0")),
        T("efficientnet_b1", lambda: tv_efficientnet("efficientnet_b1")),
        T("efficientnet_v2_s", lambda: tv_efficientnet("efficientnet_v2_s")),
        T("regnet_y_400mf", lambda: tv_regnet("y")),
        T("regnet_x_400mf", lambda: tv_regnet("x")),
        T("mnasnet0_5", lambda: tm.MNASNet(0.25, num_classes=CLASSES, dropout=0.0)),
        T("mnasnet1_0", lambda: tm.MNASNet(0.5, num_classes=CLASSES, dropout=0.0)),
        T("googlenet", lambda: tm.GoogLeNet(num_classes=CLASSES, aux_logits=False,
                                            init_weights=True, dropout=0.0), size=64),
        T("inception_v3", lambda: tm.Inception3(num_classes=CLASSES, aux_logits=False,
                                                init_weights=True, dropout=0.0), size=96,
          batch=2),
        T("vgg11_bn", lambda: tv_vgg([64, "M", 128, "M", 256, 256, "M", 512, 512, "M",
                                      512, 512, "M"], True)),
        T("vgg16", lambda: tv_vgg([64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512,
                                   512, "M", 512, 512, 512, "M"], False)),
        T("alexnet", tv_alexnet, size=64),
        T("convnext_tiny", tv_convnext),
        T("vit_b_16", lambda: tm.VisionTransformer(
            image_size=IMAGE, patch_size=8, num_layers=2, num_heads=2, hidden_dim=32,
            mlp_dim=64, num_classes=CLASSES), batch=2),
        T("swin_t", lambda: tv_swin(False), batch=2),
        T("swin_v2_t", lambda: tv_swin(True), batch=2),
        T("maxvit_t", lambda: tm.MaxVit(input_size=(IMAGE, IMAGE), stem_channels=8,
                                        partition_size=4, block_channels=[16, 32],
                                        block_layers=[1, 1], head_dim=8,
                                        stochastic_depth_prob=0.0, num_classes=CLASSES)),
        T("fcn_resnet50", lambda: tv_segmentation("fcn_resnet50"), segment=True,
          cls="torchvision.models.segmentation.fcn_resnet50"),
        T("deeplabv3_resnet50", lambda: tv_segmentation("deeplabv3_resnet50"), segment=True,
          cls="torchvision.models.segmentation.deeplabv3_resnet50"),
        T("deeplabv3_mobilenet_v3_large",
          lambda: tv_segmentation("deeplabv3_mobilenet_v3_large"), segment=True,
          cls="torchvision.models.segmentation.deeplabv3_mobilenet_v3_large"),
        T("lraspp_mobilenet_v3_large", lambda: tv_segmentation("lraspp"), segment=True,
          cls="torchvision.models.segmentation.lraspp_mobilenet_v3_large"),
    ]


class MhaTokenClassifier(nn.Module):
    """Tokens through nn.TransformerEncoder (nn.MultiheadAttention inside),
    mean-pooled to 5 classes: the encoder a user writes with torch.nn."""

    def __init__(self, batch_first, norm_first, layers=2, d=32, heads=4):
        super().__init__()
        self.batch_first = batch_first
        self.emb = nn.Embedding(50, d)
        layer = nn.TransformerEncoderLayer(d, heads, 64, dropout=0.0,
                                           batch_first=batch_first,
                                           norm_first=norm_first, activation="gelu")
        self.enc = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d, 5)

    def forward(self, x):
        h = self.emb(x)
        if not self.batch_first:
            h = h.transpose(0, 1)
        h = self.enc(h)
        if not self.batch_first:
            h = h.transpose(0, 1)
        return self.head(h.mean(1))


class MhaCrossAttention(nn.Module):
    """One nn.MultiheadAttention called directly: the first 6 tokens attend
    to all 12."""

    def __init__(self, d=32, heads=4):
        super().__init__()
        self.emb = nn.Embedding(50, d)
        self.mha = nn.MultiheadAttention(d, heads, batch_first=True)
        self.head = nn.Linear(d, 5)

    def forward(self, x):
        h = self.emb(x)
        o, _ = self.mha(h[:, :6], h, h, need_weights=False)
        return self.head(o.mean(1))


def token_sample(gen, n):
    return collections.OrderedDict([
        ("x", torch.randint(0, 50, (n, 12), generator=gen)),
        ("labels", torch.randint(0, 5, (n,), generator=gen, dtype=torch.int64))])


def torch_nn_entries():
    """Models written with torch.nn's attention modules (sequence-first
    inside nn.MultiheadAttention, whichever layout the user picks)."""
    def entry(name, make):
        return Entry(name, "torch.nn", "torch.nn.MultiheadAttention",
                     lambda: (make(), token_sample, WithLoss, 4))
    return [
        entry("mha_encoder_seq_first", lambda: MhaTokenClassifier(False, False)),
        entry("mha_encoder_batch_first", lambda: MhaTokenClassifier(True, False)),
        entry("mha_encoder_norm_first", lambda: MhaTokenClassifier(True, True)),
        entry("mha_cross_attention", MhaCrossAttention),
    ]


def newer_decoder_entries():
    """Decoders added 2026-12-06: newer architectures (multi-head latent
    attention, linear-attention and state-space hybrids, more MoE routers),
    each with its class's default layout. Last in the registry, so that
    the seeds of the entries before them (1000 + index) stay as they were."""
    E = hf_entry
    return [
        E("cohere2", "Cohere2Config", "Cohere2ForCausalLM", "causal"),
        E("olmo3", "Olmo3Config", "Olmo3ForCausalLM", "causal"),
        E("exaone4", "Exaone4Config", "Exaone4ForCausalLM", "causal"),
        E("ernie4_5", "Ernie4_5Config", "Ernie4_5ForCausalLM", "causal"),
        E("arcee", "ArceeConfig", "ArceeForCausalLM", "causal"),
        E("apertus", "ApertusConfig", "ApertusForCausalLM", "causal"),
        E("bitnet", "BitNetConfig", "BitNetForCausalLM", "causal"),
        E("diffllama", "DiffLlamaConfig", "DiffLlamaForCausalLM", "causal"),
        E("doge", "DogeConfig", "DogeForCausalLM", "causal"),
        E("lfm2", "Lfm2Config", "Lfm2ForCausalLM", "causal"),
        E("falcon_h1", "FalconH1Config", "FalconH1ForCausalLM", "causal"),
        E("jamba", "JambaConfig", "JambaForCausalLM", "causal"),
        E("nemotron_h", "NemotronHConfig", "NemotronHForCausalLM", "causal"),
        E("qwen3_next", "Qwen3NextConfig", "Qwen3NextForCausalLM", "causal"),
        E("qwen3_5", "Qwen3_5TextConfig", "Qwen3_5ForCausalLM", "causal"),
        E("llama4", "Llama4TextConfig", "Llama4ForCausalLM", "causal"),
        E("gpt_oss", "GptOssConfig", "GptOssForCausalLM", "causal"),
        E("seed_oss", "SeedOssConfig", "SeedOssForCausalLM", "causal"),
        E("vaultgemma", "VaultGemmaConfig", "VaultGemmaForCausalLM", "causal"),
        E("ministral3", "Ministral3Config", "Ministral3ForCausalLM", "causal"),
        E("minimax", "MiniMaxConfig", "MiniMaxForCausalLM", "causal"),
        E("xlstm", "xLSTMConfig", "xLSTMForCausalLM", "causal"),
        E("recurrent_gemma", "RecurrentGemmaConfig", "RecurrentGemmaForCausalLM", "causal"),
        E("modernbert_decoder", "ModernBertDecoderConfig", "ModernBertDecoderForCausalLM",
          "causal"),
        E("nanochat", "NanoChatConfig", "NanoChatForCausalLM", "causal"),
        E("granitemoe", "GraniteMoeConfig", "GraniteMoeForCausalLM", "causal"),
        E("granitemoe_shared", "GraniteMoeSharedConfig", "GraniteMoeSharedForCausalLM",
          "causal"),
        E("granite_swa", "GraniteSWAConfig", "GraniteSWAForCausalLM", "causal"),
        E("jetmoe", "JetMoeConfig", "JetMoeForCausalLM", "causal"),
        E("phimoe", "PhimoeConfig", "PhimoeForCausalLM", "causal"),
        E("glm4_moe", "Glm4MoeConfig", "Glm4MoeForCausalLM", "causal"),
        E("ernie4_5_moe", "Ernie4_5_MoeConfig", "Ernie4_5_MoeForCausalLM", "causal"),
        E("cohere2_moe", "Cohere2MoeConfig", "Cohere2MoeForCausalLM", "causal"),
        E("flex_olmo", "FlexOlmoConfig", "FlexOlmoForCausalLM", "causal"),
        E("olmo_hybrid", "OlmoHybridConfig", "OlmoHybridForCausalLM", "causal"),
        E("jais2", "Jais2Config", "Jais2ForCausalLM", "causal"),
        E("cwm", "CwmConfig", "CwmForCausalLM", "causal"),
        E("afmoe", "AfmoeConfig", "AfmoeForCausalLM", "causal"),
        E("minimax_m2", "MiniMaxM2Config", "MiniMaxM2ForCausalLM", "causal"),
        E("kimi_linear", "KimiLinearConfig", "KimiLinearForCausalLM", "causal"),
        E("exaone_moe", "ExaoneMoeConfig", "ExaoneMoeForCausalLM", "causal"),
        E("mellum", "MellumConfig", "MellumForCausalLM", "causal"),
        E("solar_open", "SolarOpenConfig", "SolarOpenForCausalLM", "causal"),
        E("gpt_neox_japanese", "GPTNeoXJapaneseConfig", "GPTNeoXJapaneseForCausalLM",
          "causal"),
        E("roberta_prelayernorm_lm", "RobertaPreLayerNormConfig",
          "RobertaPreLayerNormForCausalLM", "causal"),
        # multi-head latent attention: as many KV heads as heads
        E("deepseek_v2", "DeepseekV2Config", "DeepseekV2ForCausalLM", "causal", MLA),
        E("deepseek_v3", "DeepseekV3Config", "DeepseekV3ForCausalLM", "causal", MLA),
        E("deepseek_v32", "DeepseekV32Config", "DeepseekV32ForCausalLM", "causal", MLA),
        E("minicpm3", "MiniCPM3Config", "MiniCPM3ForCausalLM", "causal", MLA),
        E("glm4_moe_lite", "Glm4MoeLiteConfig", "Glm4MoeLiteForCausalLM", "causal", MLA),
        E("youtu", "YoutuConfig", "YoutuForCausalLM", "causal", MLA),
        E("longcat_flash", "LongcatFlashConfig", "LongcatFlashForCausalLM", "causal", MLA),
    ]


# --------------------------------------------------------------------------
# timm

# One architecture from each of timm's model families that has one of
# about 12M parameters or fewer, as timm.create_model builds it (random
# init, num_classes 10, drop and drop-path rates 0), with the keyword
# arguments that shrink it where the family takes them.
TIMM = [
    ("resnet18", {}), ("resnetv2_18", {}), ("legacy_seresnet18", {}),
    ("skresnet18", {}), ("resnest14d", {}), ("dpn68", {}), ("densenet121", {}),
    ("gernet_s", {}), ("cs3darknet_s", {}), ("cspnext_tiny", {}),
    ("hrnet_w18_small", {}), ("ese_vovnet19b_slim", {}), ("nf_regnet_b0", {}),
    ("regnetx_004_tv", {}), ("rexnet_100", {}), ("ghostnet_050", {}),
    ("repghostnet_050", {}), ("hardcorenas_a", {}), ("tinynet_a", {}),
    ("mobilenetv3_small_050", {}), ("lcnetv2_small", {}), ("fasternet_t0", {}),
    ("starnet_s1", {}), ("hgnet_tiny", {}), ("convnext_atto", {}),
    ("inception_next_atto", {}), ("mambaout_femto", {}), ("edgenext_small", {}),
    ("efficientvit_b0", {}), ("fastvit_s12", {}), ("repvit_m0_9", {"img_size": 64}),
    ("pvt_v2_b0", {}), ("tiny_vit_5m_224", {}), ("mobilevit_xxs", {"img_size": 64}),
    ("efficientformerv2_s0", {"img_size": 64}), ("swiftformer_xs", {"img_size": 64}),
    ("efficientvit_m0", {"img_size": 64}), ("shvit_s1", {}), ("iformer_s", {}),
    ("vit_tiny_patch16_224", {"img_size": 64, "depth": 2}),
    ("deit_tiny_patch16_224", {"img_size": 64, "depth": 2}),
    ("eva02_tiny_patch14_224", {"img_size": 64, "depth": 2}),
    ("cait_xxs24_224", {"img_size": 64, "depth": 2}),
    ("xcit_nano_12_p8_224", {"img_size": 64, "depth": 2}),
    ("convit_tiny", {"img_size": 64, "depth": 2}),
    ("gmlp_ti16_224", {"img_size": 64}),
    ("pit_xs_224", {"img_size": 64}), ("coat_tiny", {"img_size": 64}),
    ("visformer_tiny", {"img_size": 64}),
    ("maxvit_pico_rw_256", {"img_size": 64}), ("gcvit_xxtiny", {"img_size": 64}),
    ("vit_tiny_r_s16_p8_224", {"img_size": 64, "depth": 2}),
    ("beit_base_patch16_224", {"img_size": 64, "embed_dim": 64, "depth": 2,
                               "num_heads": 2}),
    ("swin_tiny_patch4_window7_224", {"img_size": 64, "window_size": 4,
                                      "embed_dim": 32, "depths": (1, 1, 1, 1),
                                      "num_heads": (1, 2, 2, 4)}),
    ("levit_128s", {"img_size": 64}),
    ("poolformer_s12", {}),
]


def timm_entries():
    """timm's families (the table above), 64x64 images, batch 2,
    cross-entropy. Last in the registry (seeds by index)."""
    def entry(name, kwargs):
        def build():
            import timm
            try:
                m = timm.create_model(name, pretrained=False, num_classes=CLASSES,
                                      drop_rate=0.0, drop_path_rate=0.0, **kwargs)
            except TypeError:  # a family without drop path
                m = timm.create_model(name, pretrained=False, num_classes=CLASSES,
                                      drop_rate=0.0, **kwargs)
            no_dropout(m)
            return m, functools.partial(image_sample, size=64, key="x"), WithLoss, 2
        return Entry("timm_" + name, "timm", "timm." + name, build)
    return [entry(n, kw) for n, kw in TIMM]


# --------------------------------------------------------------------------
# torchvision's video classifiers and optical flow

FRAMES = 8


def video_sample(gen, n, frames=FRAMES, size=IMAGE):
    return collections.OrderedDict([
        ("x", torch.randn(n, 3, frames, size, size, generator=gen)),
        ("labels", torch.randint(0, CLASSES, (n,), generator=gen, dtype=torch.int64))])


def small_video_resnet(convs, stem_2plus1d=False, width=8, layers=(1, 1, 1, 1)):
    """torchvision's VideoResNet (r3d, mc3, r2plus1d) rebuilt at `width`
    (64 in the library), one block a stage (two in r3d_18), with its own
    blocks and _make_layer; the stem is
    the library's BasicStem / R2Plus1dStem at that width."""
    from torchvision.models.video.resnet import BasicBlock, VideoResNet
    m = VideoResNet(BasicBlock, convs, [1, 1, 1, 1], nn.Identity, num_classes=CLASSES)
    if stem_2plus1d:
        mid = width * 45 // 64
        m.stem = nn.Sequential(
            nn.Conv3d(3, mid, (1, 7, 7), (1, 2, 2), (0, 3, 3), bias=False), nn.BatchNorm3d(mid),
            nn.ReLU(inplace=True),
            nn.Conv3d(mid, width, (3, 1, 1), 1, (1, 0, 0), bias=False), nn.BatchNorm3d(width),
            nn.ReLU(inplace=True))
    else:
        m.stem = nn.Sequential(
            nn.Conv3d(3, width, (3, 7, 7), (1, 2, 2), (1, 3, 3), bias=False),
            nn.BatchNorm3d(width), nn.ReLU(inplace=True))
    m.inplanes = width
    for i, name in enumerate(("layer1", "layer2", "layer3", "layer4")):
        setattr(m, name, m._make_layer(BasicBlock, convs[i], width << i, layers[i],
                                       stride=1 if i == 0 else 2))
    m.fc = nn.Linear(8 * width, CLASSES)
    for mod in m.modules():
        if isinstance(mod, nn.Conv3d):
            nn.init.kaiming_normal_(mod.weight, mode="fan_out", nonlinearity="relu")
    return m


def small_mvit(v2):
    """torchvision's MViT (v1: the mvit_v1_b options, v2: mvit_v2_s's) with
    three small blocks: 16 then 32 channels, pooled queries in the second."""
    from torchvision.models.video.mvit import MSBlockConfig, MViT
    pool = [3, 3, 3]
    blocks = [MSBlockConfig(1, 16, 16, pool, pool, [1, 1, 1], [1, 2, 2]),
              MSBlockConfig(2, 16, 32, pool, pool, [1, 2, 2], [1, 1, 1]),
              MSBlockConfig(2, 32, 32, pool, pool, [1, 1, 1], [1, 1, 1])]
    return MViT(spatial_size=(IMAGE, IMAGE), temporal_size=FRAMES, block_setting=blocks,
                residual_pool=v2, residual_with_cls_embed=not v2, rel_pos_embed=v2,
                proj_after_attn=v2, dropout=0.0, stochastic_depth_prob=0.0,
                num_classes=CLASSES)


def small_s3d():
    """torchvision's S3D as the library builds it (its widths), with its
    fixed (2, 7, 7) average pool made adaptive so 32x32 clips fit."""
    from torchvision.models.video import S3D
    m = S3D(num_classes=CLASSES, dropout=0.0)
    m.avgpool = nn.AdaptiveAvgPool3d(1)
    return m


class FlowWithLoss(nn.Module):
    """RAFT's training loss: every refinement's flow against the target,
    L1, weighted gamma^(N-1-i) (the paper's sequence loss)."""

    def __init__(self, m, updates=3, gamma=0.8):
        super().__init__()
        self.m, self.updates, self.gamma = m, updates, gamma

    def forward(self, image1, image2, flow):
        preds = self.m(image1, image2, num_flow_updates=self.updates)
        loss = 0
        for i, p in enumerate(preds):
            loss = loss + self.gamma ** (len(preds) - 1 - i) * (p - flow).abs().mean()
        return loss


def flow_sample(gen, n, size=64):
    return collections.OrderedDict([
        ("image1", torch.randn(n, 3, size, size, generator=gen)),
        ("image2", torch.randn(n, 3, size, size, generator=gen)),
        ("flow", torch.randn(n, 2, size, size, generator=gen))])


def small_raft():
    """torchvision's RAFT (the raft_small blocks) at small widths: encoders
    (8, 8, 16, 24, 32), a 3-level correlation pyramid of radius 2."""
    from torchvision.models.optical_flow.raft import BottleneckBlock, _raft
    return _raft(weights=None, progress=False,
                 feature_encoder_layers=(8, 8, 16, 24, 32),
                 feature_encoder_block=BottleneckBlock,
                 feature_encoder_norm_layer=nn.InstanceNorm2d,
                 context_encoder_layers=(8, 8, 16, 24, 40),
                 context_encoder_block=BottleneckBlock, context_encoder_norm_layer=None,
                 corr_block_num_levels=3, corr_block_radius=2,
                 motion_encoder_corr_layers=(24,), motion_encoder_flow_layers=(16, 8),
                 motion_encoder_out_channels=22, recurrent_block_hidden_state_size=24,
                 recurrent_block_kernel_size=(3,), recurrent_block_padding=(1,),
                 flow_head_hidden_size=32, use_mask_predictor=False)


def torchvision_video_entries():
    """torchvision.models.video and .optical_flow, after timm in the
    registry (seeds by index): 8-frame 32x32 clips, batch 2."""
    from torchvision.models.video.resnet import Conv2Plus1D, Conv3DNoTemporal, Conv3DSimple

    def video(name, make, cls=None):
        def build():
            return make(), video_sample, WithLoss, 2
        return Entry(name, "torchvision", cls or "torchvision.models.video." + name, build)

    def raft():
        return small_raft(), flow_sample, FlowWithLoss, 2
    return [
        video("r3d_18", lambda: small_video_resnet([Conv3DSimple] * 4)),
        video("mc3_18", lambda: small_video_resnet([Conv3DSimple] + [Conv3DNoTemporal] * 3)),
        video("r2plus1d_18", lambda: small_video_resnet([Conv2Plus1D] * 4, stem_2plus1d=True)),
        video("s3d", small_s3d),
        video("mvit_v1_b", lambda: small_mvit(False)),
        video("mvit_v2_s", lambda: small_mvit(True)),
        video("swin3d_t", lambda: __import__("torchvision").models.video.SwinTransformer3d(
            patch_size=[2, 4, 4], embed_dim=16, depths=[1, 1], num_heads=[2, 2],
            window_size=[2, 4, 4], stochastic_depth_prob=0.0, num_classes=CLASSES)),
        Entry("raft_small", "torchvision", "torchvision.models.optical_flow.raft_small", raft),
    ]


def more_causal_entries():
    """Causal-LM classes of transformers' auto mapping (5.24) that the lists
    above did not have, added 2026-12-07: each that builds at the sweep's
    sizes with the generic shrinker and its class's defaults (newer
    decoders, and the encoders' causal heads with is_decoder set, as their
    users set it). After the earlier lists in the registry, so that the
    seeds of the entries before them stay as they were."""
    E = hf_entry
    return [
        E("apertus1p5_text", "Apertus1p5TextConfig", "Apertus1p5TextForCausalLM", "causal"),
        E("aria_text", "AriaTextConfig", "AriaTextForCausalLM", "causal"),
        E("bailing_hybrid", "BailingHybridConfig", "BailingHybridForCausalLM", "causal"),
        E("bart_causal", "BartConfig", "BartForCausalLM", "causal"),
        E("beam", "BeamConfig", "BeamForCausalLM", "causal"),
        E("bert_causal", "BertConfig", "BertLMHeadModel", "causal", {"is_decoder": True}),
        E("bert_generation", "BertGenerationConfig", "BertGenerationDecoder",
          "causal", {"is_decoder": True}),
        E("big_bird_causal", "BigBirdConfig", "BigBirdForCausalLM", "causal", {"is_decoder": True}),
        E("bigbird_pegasus", "BigBirdPegasusConfig", "BigBirdPegasusForCausalLM", "causal"),
        E("blenderbot_causal", "BlenderbotConfig", "BlenderbotForCausalLM", "causal"),
        E("blenderbot_small_causal", "BlenderbotSmallConfig", "BlenderbotSmallForCausalLM",
          "causal"),
        E("camembert_causal", "CamembertConfig", "CamembertForCausalLM",
          "causal", {"is_decoder": True}),
        E("cpmant", "CpmAntConfig", "CpmAntForCausalLM", "causal"),
        E("data2vec_text_causal", "Data2VecTextConfig", "Data2VecTextForCausalLM",
          "causal", {"is_decoder": True}),
        E("deepseek_v4", "DeepseekV4Config", "DeepseekV4ForCausalLM", "causal"),
        E("dory", "DoryConfig", "DoryForCausalLM", "causal"),
        E("electra_causal", "ElectraConfig", "ElectraForCausalLM", "causal", {"is_decoder": True}),
        E("ernie_causal", "ErnieConfig", "ErnieForCausalLM", "causal", {"is_decoder": True}),
        E("flint", "FlintConfig", "FlintForCausalLM", "causal"),
        E("granitemoe_swa", "GraniteMoeSWAConfig", "GraniteMoeSWAForCausalLM", "causal"),
        E("hrm_text", "HrmTextConfig", "HrmTextForCausalLM", "causal"),
        E("hy_v3", "HYV3Config", "HYV3ForCausalLM", "causal"),
        E("hy_v4", "HYV4Config", "HYV4ForCausalLM", "causal"),
        E("hyperclovax", "HyperCLOVAXConfig", "HyperCLOVAXForCausalLM", "causal"),
        E("inkling2_loop_text", "Inkling2LoopTextConfig", "Inkling2LoopForCausalLM", "causal"),
        E("inkling2_text", "Inkling2TextConfig", "Inkling2ForCausalLM", "causal"),
        E("inkling_text", "InklingTextConfig", "InklingForCausalLM", "causal"),
        E("kolibri1", "Kolibri1Config", "Kolibri1ForCausalLM", "causal"),
        E("laguna", "LagunaConfig", "LagunaForCausalLM", "causal"),
        E("lara_mini", "LaraMiniConfig", "LaraMiniForCausalLM", "causal"),
        E("lfm3", "Lfm3Config", "Lfm3ForCausalLM", "causal"),
        E("marian_causal", "MarianConfig", "MarianForCausalLM", "causal"),
        E("mbart_causal", "MBartConfig", "MBartForCausalLM", "causal"),
        E("megatron_bert_causal", "MegatronBertConfig", "MegatronBertForCausalLM",
          "causal", {"is_decoder": True}),
        E("mimo_v2_flash", "MiMoV2FlashConfig", "MiMoV2FlashForCausalLM", "causal"),
        E("minimax_m3_vl_text", "MiniMaxM3VLTextConfig", "MiniMaxM3VLForCausalLM", "causal"),
        E("moshi", "MoshiConfig", "MoshiForCausalLM", "causal"),
        E("mvp", "MvpConfig", "MvpForCausalLM", "causal"),
        E("pegasus_causal", "PegasusConfig", "PegasusForCausalLM", "causal"),
        E("plbart_causal", "PLBartConfig", "PLBartForCausalLM", "causal"),
        E("prophetnet", "ProphetNetConfig", "ProphetNetForCausalLM", "causal"),
        E("qwen3_5_moe_text", "Qwen3_5MoeTextConfig", "Qwen3_5MoeForCausalLM", "causal"),
        E("qwen4_exp_text", "Qwen4ExpTextConfig", "Qwen4ExpForCausalLM", "causal"),
        E("rembert_causal", "RemBertConfig", "RemBertForCausalLM", "causal", {"is_decoder": True}),
        E("roberta_causal", "RobertaConfig", "RobertaForCausalLM", "causal", {"is_decoder": True}),
        E("roc_bert", "RoCBertConfig", "RoCBertForCausalLM", "causal", {"is_decoder": True}),
        E("roformer_causal", "RoFormerConfig", "RoFormerForCausalLM",
          "causal", {"is_decoder": True}),
        E("trocr", "TrOCRConfig", "TrOCRForCausalLM", "causal"),
        E("whisper_causal", "WhisperConfig", "WhisperForCausalLM", "causal"),
        E("xlm", "XLMConfig", "XLMWithLMHeadModel", "causal"),
        E("xlm_roberta_causal", "XLMRobertaConfig", "XLMRobertaForCausalLM",
          "causal", {"is_decoder": True}),
        E("xlm_roberta_xl", "XLMRobertaXLConfig", "XLMRobertaXLForCausalLM",
          "causal", {"is_decoder": True}),
        E("xlnet", "XLNetConfig", "XLNetLMHeadModel", "causal"),
        # and those whose defaults the shrinker cannot cut alone: a head
        # size, the layer pattern of two layers, the routers' top-k
        E("ministral", "MinistralConfig", "MinistralForCausalLM", "causal",
          {"head_dim": 8, "layer_types": ["sliding_attention", "full_attention"],
           "sliding_window": 8}),
        E("hunyuan_v1_dense", "HunYuanDenseV1Config", "HunYuanDenseV1ForCausalLM", "causal",
          {"head_dim": 8}),
        E("hunyuan_v1_moe", "HunYuanMoEV1Config", "HunYuanMoEV1ForCausalLM", "causal",
          {"head_dim": 8}),
        E("bamba", "BambaConfig", "BambaForCausalLM", "causal",
          {"attn_layer_indices": [1], "mamba_n_heads": 8, "mamba_d_head": 8,
           "mamba_d_state": 8, "mamba_chunk_size": 8}),
        E("granitemoehybrid", "GraniteMoeHybridConfig", "GraniteMoeHybridForCausalLM",
          "causal", {"layer_types": ["linear_attention", "full_attention"],
                     "mamba_n_heads": 8, "mamba_d_head": 8, "mamba_d_state": 8,
                     "mamba_chunk_size": 8}),
        E("zamba2", "Zamba2Config", "Zamba2ForCausalLM", "causal",
          {"attention_head_dim": 8, "mamba_headdim": 8, "n_mamba_heads": 8,
           "mamba_d_state": 8, "hybrid_layer_ids": [1], "layers_block_type": ["mamba", "hybrid"],
           "use_mamba_kernels": False}),
        E("lfm2_moe", "Lfm2MoeConfig", "Lfm2MoeForCausalLM", "causal",
          {"layer_types": ["conv", "full_attention"], "num_dense_layers": 1}),
        E("gemma4_text", "Gemma4TextConfig", "Gemma4ForCausalLM", "causal",
          {"head_dim": 8, "global_head_dim": 8, "sliding_window": 8,
           "layer_types": ["sliding_attention", "full_attention"],
           "vocab_size_per_layer_input": VOCAB, "hidden_size_per_layer_input": 8}),
        E("dots1", "Dots1Config", "Dots1ForCausalLM", "causal",
          {"layer_types": ["full_attention", "full_attention"], "first_k_dense_replace": 1,
           "n_routed_experts": 4, "n_shared_experts": 1, "num_experts_per_tok": 2}),
        E("reformer", "ReformerConfig", "ReformerModelWithLMHead", "causal",
          {"is_decoder": True, "attn_layers": ["local", "local"], "axial_pos_embds": False,
           "local_attn_chunk_length": 4}),
    ]


# The sweep's sizes for an image-text model's towers.
TOWER = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
         "num_attention_heads": 4, "image_size": IMAGE, "patch_size": 8}
TEXT_TOWER = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
              "num_attention_heads": 4, "vocab_size": VOCAB}


def more_task_entries():
    """The masked-LM, sequence-to-sequence, image-classification and CTC
    classes of transformers' auto mappings (5.24) that the lists above did
    not have, added 2026-12-07: each that builds at the sweep's sizes with
    the generic shrinker and its class's defaults to under 2 million
    parameters. After more_causal_entries in the registry (seeds by
    index)."""
    E = hf_entry
    return [
        # masked language models
        E("eurobert", "EuroBertConfig", "EuroBertForMaskedLM", "masked"),
        E("flaubert", "FlaubertConfig", "FlaubertWithLMHeadModel", "masked"),
        E("gte", "GteConfig", "GteForMaskedLM", "masked"),
        E("ibert", "IBertConfig", "IBertForMaskedLM", "masked"),
        E("jina_embeddings_v3", "JinaEmbeddingsV3Config", "JinaEmbeddingsV3ForMaskedLM", "masked"),
        E("layoutlm", "LayoutLMConfig", "LayoutLMForMaskedLM", "masked"),
        E("mra", "MraConfig", "MraForMaskedLM", "masked"),
        E("nomic_bert", "NomicBertConfig", "NomicBertForMaskedLM", "masked"),
        E("roberta_prelayernorm", "RobertaPreLayerNormConfig", "RobertaPreLayerNormForMaskedLM",
          "masked"),
        E("tapas", "TapasConfig", "TapasForMaskedLM", "masked"),
        E("ultrabert", "UltrabertConfig", "UltrabertForMaskedLM", "masked"),
        E("xlm_roberta_xl_masked", "XLMRobertaXLConfig", "XLMRobertaXLForMaskedLM", "masked"),
        E("yoso", "YosoConfig", "YosoForMaskedLM", "masked"),
        # encoder-decoders
        E("bigbird_pegasus_s2s", "BigBirdPegasusConfig", "BigBirdPegasusForConditionalGeneration",
          "seq2seq"),
        E("led", "LEDConfig", "LEDForConditionalGeneration", "seq2seq"),
        E("mvp_s2s", "MvpConfig", "MvpForConditionalGeneration", "seq2seq"),
        E("nllb_moe", "NllbMoeConfig", "NllbMoeForConditionalGeneration", "seq2seq"),
        E("pegasus_x", "PegasusXConfig", "PegasusXForConditionalGeneration", "seq2seq"),
        E("prophetnet_s2s", "ProphetNetConfig", "ProphetNetForConditionalGeneration", "seq2seq"),
        E("seamless_m4t", "SeamlessM4TConfig", "SeamlessM4TForTextToText", "seq2seq"),
        E("seamless_m4t_v2", "SeamlessM4Tv2Config", "SeamlessM4Tv2ForTextToText", "seq2seq"),
        # vision
        E("dinov2_with_registers", "Dinov2WithRegistersConfig",
          "Dinov2WithRegistersForImageClassification", "image"),
        E("ijepa", "IJepaConfig", "IJepaForImageClassification", "image"),
        # image classifiers of the image-text families: the vision tower's
        # sub-config given whole (the text tower is built and unused)
        E("clip_image", "CLIPConfig", "CLIPForImageClassification", "image",
          {"vision_config": TOWER, "text_config": TEXT_TOWER}),
        E("siglip_image", "SiglipConfig", "SiglipForImageClassification", "image",
          {"vision_config": TOWER, "text_config": TEXT_TOWER}),
        E("metaclip_2_image", "MetaClip2Config", "MetaClip2ForImageClassification", "image",
          {"vision_config": TOWER, "text_config": TEXT_TOWER}),
        E("donut_swin", "DonutSwinConfig", "DonutSwinForImageClassification", "image",
          {"embed_dim": 16, "depths": [1, 1], "num_heads": [2, 2], "window_size": 4,
           "patch_size": 4}),
        # speech (CTC)
        E("sew_d", "SEWDConfig", "SEWDForCTC", "ctc", AUDIO_CFG),
        E("unispeech_sat", "UniSpeechSatConfig", "UniSpeechSatForCTC", "ctc", AUDIO_CFG),
        E("wav2vec2_conformer", "Wav2Vec2ConformerConfig", "Wav2Vec2ConformerForCTC",
          "ctc", AUDIO_CFG),
    ]


def overridden_decoder_entries():
    """DBRX, whose defaults the shrinker cannot cut, with the overrides it
    needs (added 2026-12-07, after more_task_entries in the registry so
    that its seeds stay): its attention and experts sub-configs, clip_qkv
    set (its default None breaks its clamp). (Gemma 3n's text model, with
    the overrides it needs, crashes PyTorch 2.15 itself: a segfault in
    libtorch_cpu while the sweep builds its references.)"""
    E = hf_entry
    return [
        E("dbrx", "DbrxConfig", "DbrxForCausalLM", "causal",
          {"attn_config": {"kv_n_heads": 2, "rope_theta": 10000.0, "clip_qkv": 8.0},
           "ffn_config": {"ffn_hidden_size": 64, "moe_num_experts": 4, "moe_top_k": 2}}),
    ]


# Mixture-of-experts entries again with transformers' batched_mm experts
# (experts_implementation="batched_mm": each token's chosen experts' weights
# gathered, one batched product): the default loop over the experts a batch
# hits is data-dependent, and PyTorch's dynamo exporter refuses it.
BATCHED_MOE = ("mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "phimoe", "granitemoe",
               "granitemoe_shared", "gpt_oss", "deepseek_v2", "deepseek_v3", "glm4_moe",
               "ernie4_5_moe", "flex_olmo", "minimax", "jamba", "qwen3_next",
               # and the rest whose dynamo export stops at the experts loop
               "afmoe", "cohere2_moe", "exaone_moe", "glm4_moe_lite", "kimi_linear",
               "longcat_flash", "minimax_m2", "solar_open", "deepseek_v32", "nemotron_h",
               "hunyuan_v1_moe", "granitemoehybrid", "lfm2_moe", "dots1", "aria_text",
               "deepseek_v4", "granitemoe_swa", "hy_v3", "laguna", "lara_mini",
               "mimo_v2_flash", "kolibri1", "qwen3_5_moe_text", "qwen4_exp_text")


def variant(entry, name, **overrides):
    """`entry` (an hf_entry) again as `name` with more config overrides,
    seeded as `entry` (zoo.py): the same weights and samples."""
    a = dict(entry.build.hf_args)
    a["overrides"] = dict(a["overrides"] or {}, **overrides)
    v = hf_entry(name, **a)
    v.build.seed_of = entry.name
    return v


def batched_moe_entries(entries):
    return [variant(e, e.name + "_bmm", experts_implementation="batched_mm")
            for e in entries if e.name in BATCHED_MOE]


def diagnostic_entries(entries):
    """HRM's earlier inner cycles run under torch.no_grad(), which no
    exporter records (hrm_text's gradients differ from PyTorch's); with
    every cycle differentiated the export is the module's computation."""
    by_name = {e.name: e for e in entries}
    return [variant(by_name["hrm_text"], "hrm_text_full_bp", L_bp_cycles=[3, 3])]


def registry():
    """Every entry, torchvision first (the CNNs carry the BatchNorm and
    convolution families), then transformers, then torch.nn's own attention
    modules, then the newer decoders, then timm's families, then
    torchvision's video classifiers and optical flow, then more causal-LM
    classes, then more of the other tasks' classes, then the mixture-of-
    experts entries with batched experts, then diagnostic variants (variant:
    seeded as the entry they vary), then torch.nn's losses, then calls
    the dynamo exporter writes as something else, then torch.nn's
    layers."""
    first = (torchvision_entries() + transformers_entries() + torch_nn_entries()
             + newer_decoder_entries() + timm_entries() + torchvision_video_entries()
             + more_causal_entries() + more_task_entries() + overridden_decoder_entries())
    return (first + batched_moe_entries(first) + diagnostic_entries(first)
            + loss_entries() + exporter_gap_entries() + layer_entries())


# --------------------------------------------------------------------------
# torch.nn's losses

# Each of PyTorch's loss modules (and torchvision's focal loss) with the
# options users set (class weights, ignored labels, label smoothing,
# probability targets, reductions, margins, norms), on a small network:
# a user's own loss is what trains, so each must train as PyTorch trains it.
# The network gives the loss its inputs: `LOSS_OUT` scores per row (or per
# position, for the spatial cross-entropy), and the sample the targets.
LOSS_IN = 8
LOSS_OUT = 6
LOSS_ROWS = 8


class LossNet(nn.Module):
    """Two layers, then `heads` linear heads (a loss that compares two or
    three embeddings gets one head each)."""

    def __init__(self, heads=1, out=LOSS_OUT):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(LOSS_IN, 16), nn.Tanh())
        self.heads = nn.ModuleList(nn.Linear(16, out) for _ in range(heads))

    def forward(self, x):
        h = self.body(x)
        return [head(h) for head in self.heads]


class ApplyLoss(nn.Module):
    """forward(x, *targets) -> loss(LossNet's heads(x), targets), the loss
    module (with its weight buffers) a submodule as a user writes it."""

    def __init__(self, m, loss, prepare=None):
        super().__init__()
        self.m = m
        self.loss = loss
        self.prepare = prepare

    def forward(self, x, t=None, u=None):
        outs = self.m(x)
        if self.prepare is not None:
            outs = self.prepare(outs)
        return self.loss(*outs, *[a for a in (t, u) if a is not None])


def loss_sample(gen, n, targets):
    """x (n, LOSS_IN) and the targets `targets(gen, n)` draws."""
    d = collections.OrderedDict([("x", torch.randn(n, LOSS_IN, generator=gen))])
    for i, t in enumerate(targets(gen, n)):
        d["target" if i == 0 else "target%d" % i] = t
    return d


def labels(gen, n, ignore=None, classes=LOSS_OUT):
    """Class indices; every fourth row `ignore` where given (each
    microbatch keeps labelled rows, so a mean over them is defined)."""
    y = torch.randint(0, classes, (n,), generator=gen, dtype=torch.int64)
    if ignore is not None:
        y[1::4] = ignore
    return y


def signs(gen, n, shape=()):
    return torch.randint(0, 2, (n,) + shape, generator=gen).to(torch.float32) * 2 - 1


def multilabel_targets(gen, n):
    """MultiLabelMarginLoss's targets: each row's classes, then -1."""
    t = torch.full((n, LOSS_OUT), -1, dtype=torch.int64)
    for i in range(n):
        k = 1 + int(torch.randint(0, 3, (1,), generator=gen))
        t[i, :k] = torch.randperm(LOSS_OUT, generator=gen)[:k]
    return t


def class_weights():
    return torch.tensor([0.5, 1.0, 2.0, 1.5, 0.25, 1.25])


def loss_entries():
    """torch.nn's loss modules, one entry per module and option set."""
    f = torch.nn.functional

    def entry(name, loss, targets, heads=1, prepare=None, cls=None):
        def build():
            sample = functools.partial(loss_sample, targets=targets)
            wrap = functools.partial(ApplyLoss, loss=loss(), prepare=prepare)
            return LossNet(heads), sample, wrap, LOSS_ROWS
        return Entry("loss_" + name, "torch.nn losses", cls or "torch.nn." + type(loss()).__name__,
                     build)

    def floats(scale=1.0):
        return lambda gen, n: [torch.randn(n, LOSS_OUT, generator=gen) * scale]

    def unit(gen, n):
        return [torch.rand(n, LOSS_OUT, generator=gen)]

    def probs(gen, n):
        return [torch.softmax(torch.randn(n, LOSS_OUT, generator=gen) * 2, -1)]

    def counts(gen, n):
        return [torch.poisson(torch.rand(n, LOSS_OUT, generator=gen) * 4, generator=gen)]

    def spatial(gen, n):
        y = torch.randint(0, 3, (n, 2), generator=gen, dtype=torch.int64)
        y[1::3, 1] = -100
        return [y]

    def log_softmax(outs):
        return [torch.log_softmax(outs[0], -1)]

    def sigmoid(outs):
        return [torch.sigmoid(outs[0])]

    def positions(outs):   # (n, 6) scores as (n, 3 classes, 2 positions)
        return [outs[0].reshape(-1, 3, 2)]

    def mean_and_var(outs):
        return [outs[0], f.softplus(outs[1]) + 1e-3]

    class GaussianNLL(nn.Module):   # the module takes (input, target, var)
        def __init__(self):
            super().__init__()
            self.loss = nn.GaussianNLLLoss(full=True)

        def forward(self, mean, var, target):
            return self.loss(mean, target, var)

    def rate(outs):
        return [f.softplus(outs[0])]

    def pair(outs):
        return [outs[0][:, 0], outs[1][:, 0]]

    def first(outs):
        return [outs[0][:, 0]]

    class Focal(nn.Module):
        def forward(self, logits, target):
            import torchvision
            return torchvision.ops.sigmoid_focal_loss(logits, target, alpha=0.25, gamma=2.0,
                                                      reduction="mean")

    class RowWeighted(nn.Module):   # reduction="none", then weights per row
        def __init__(self, loss):
            super().__init__()
            self.loss = loss

        def forward(self, scores, target):
            rows = self.loss(scores, target)
            return (rows * torch.linspace(0.5, 1.5, rows.shape[0])).sum()

    def cosine_distance(a, b):
        return 1.0 - f.cosine_similarity(a, b)

    return [
        entry("l1", nn.L1Loss, floats()),
        entry("mse_sum", lambda: nn.MSELoss(reduction="sum"), floats()),
        entry("smooth_l1", lambda: nn.SmoothL1Loss(beta=0.5), floats(0.5)),
        entry("huber", lambda: nn.HuberLoss(delta=0.7), floats(0.8)),
        entry("ce_weight_ignore", lambda: nn.CrossEntropyLoss(weight=class_weights(), ignore_index=3),
              lambda gen, n: [labels(gen, n, ignore=3)]),
        entry("ce_label_smoothing", lambda: nn.CrossEntropyLoss(label_smoothing=0.1),
              lambda gen, n: [labels(gen, n)]),
        entry("ce_smoothing_weight_ignore",
              lambda: nn.CrossEntropyLoss(weight=class_weights(), label_smoothing=0.2),
              lambda gen, n: [labels(gen, n, ignore=-100)]),
        entry("ce_probabilities", lambda: nn.CrossEntropyLoss(label_smoothing=0.05), probs),
        entry("ce_spatial_smoothing_sum",
              lambda: nn.CrossEntropyLoss(label_smoothing=0.15, reduction="sum"), spatial,
              prepare=positions),
        entry("ce_probabilities_weight_rows",
              lambda: RowWeighted(nn.CrossEntropyLoss(weight=class_weights(),
                                                      label_smoothing=0.1, reduction="none")),
              probs, cls="torch.nn.CrossEntropyLoss"),
        entry("ce_smoothing_rows",
              lambda: RowWeighted(nn.CrossEntropyLoss(weight=class_weights(), ignore_index=2,
                                                      label_smoothing=0.3, reduction="none")),
              lambda gen, n: [labels(gen, n, ignore=2)], cls="torch.nn.CrossEntropyLoss"),
        entry("ce_sum", lambda: nn.CrossEntropyLoss(reduction="sum"),
              lambda gen, n: [labels(gen, n)]),
        entry("ce_spatial", nn.CrossEntropyLoss, spatial, prepare=positions),
        entry("nll_weight", lambda: nn.NLLLoss(weight=class_weights()),
              lambda gen, n: [labels(gen, n)], prepare=log_softmax),
        entry("nll_sum_ignore", lambda: nn.NLLLoss(reduction="sum", ignore_index=0),
              lambda gen, n: [labels(gen, n, ignore=0)], prepare=log_softmax),
        entry("bce_weight", lambda: nn.BCELoss(weight=class_weights()), unit, prepare=sigmoid),
        entry("bce_logits_pos_weight",
              lambda: nn.BCEWithLogitsLoss(pos_weight=class_weights() * 2), unit),
        entry("kl_div_batchmean", lambda: nn.KLDivLoss(reduction="batchmean"), probs,
              prepare=log_softmax),
        entry("kl_div_log_target", lambda: nn.KLDivLoss(reduction="batchmean", log_target=True),
              lambda gen, n: [torch.log(probs(gen, n)[0])], prepare=log_softmax),
        entry("poisson_nll_full", lambda: nn.PoissonNLLLoss(log_input=True, full=True), counts),
        entry("poisson_nll_rate", lambda: nn.PoissonNLLLoss(log_input=False), counts,
              prepare=rate),
        entry("gaussian_nll", GaussianNLL, floats(), heads=2, prepare=mean_and_var,
              cls="torch.nn.GaussianNLLLoss"),
        entry("margin_ranking", lambda: nn.MarginRankingLoss(margin=0.2),
              lambda gen, n: [signs(gen, n)], heads=2, prepare=pair),
        entry("hinge_embedding", lambda: nn.HingeEmbeddingLoss(margin=1.0),
              lambda gen, n: [signs(gen, n, (LOSS_OUT,))], prepare=rate),
        entry("soft_margin", nn.SoftMarginLoss, lambda gen, n: [signs(gen, n, (LOSS_OUT,))]),
        entry("multilabel_soft_margin",
              lambda: nn.MultiLabelSoftMarginLoss(weight=class_weights()),
              lambda gen, n: [torch.randint(0, 2, (n, LOSS_OUT), generator=gen).float()]),
        entry("multilabel_margin", nn.MultiLabelMarginLoss,
              lambda gen, n: [multilabel_targets(gen, n)]),
        entry("multi_margin", lambda: nn.MultiMarginLoss(weight=class_weights()),
              lambda gen, n: [labels(gen, n)]),
        entry("multi_margin_p2", lambda: nn.MultiMarginLoss(p=2, margin=0.5),
              lambda gen, n: [labels(gen, n)]),
        entry("cosine_embedding", lambda: nn.CosineEmbeddingLoss(margin=0.1),
              lambda gen, n: [signs(gen, n)], heads=2),
        entry("triplet_margin", lambda: nn.TripletMarginLoss(margin=1.0, p=2, swap=True),
              lambda gen, n: [], heads=3),
        entry("triplet_distance",
              lambda: nn.TripletMarginWithDistanceLoss(distance_function=cosine_distance,
                                                       margin=0.5),
              lambda gen, n: [], heads=3),
        entry("sigmoid_focal", Focal, lambda gen, n: [torch.randint(
            0, 2, (n, LOSS_OUT), generator=gen).float()], cls="torchvision.ops.sigmoid_focal_loss"),
    ]


# --------------------------------------------------------------------------
# PyTorch functions whose export leaves out part of the call

class ScatterMean(nn.Module):
    """Message passing's mean aggregation: each row's 6 messages averaged
    into 4 slots by `index` (x.scatter_reduce(1, index, src, "mean")),
    with or without the slots' own values, then a linear head."""

    def __init__(self, include_self):
        super().__init__()
        self.include_self = include_self
        self.slots = nn.Linear(LOSS_IN, 4)
        self.messages = nn.Linear(LOSS_IN, 6)
        self.head = nn.Linear(4, LOSS_OUT)

    def forward(self, x, index):
        out = self.slots(x).scatter_reduce(1, index, torch.tanh(self.messages(x)), "mean",
                                           include_self=self.include_self)
        return self.head(out)


class WithIndexLoss(nn.Module):
    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, x, index, labels):
        return F.cross_entropy(self.m(x, index), labels)


def scatter_sample(gen, n):
    """x, messages' slots (slot 3 left empty in every other row), labels."""
    index = torch.randint(0, 4, (n, 6), generator=gen)
    index[::2] = index[::2] % 3
    return collections.OrderedDict([
        ("x", torch.randn(n, LOSS_IN, generator=gen)), ("index", index),
        ("labels", torch.randint(0, LOSS_OUT, (n,), generator=gen))])


class AvgPoolDivisor(nn.Module):
    """A convolution, then F.avg_pool2d with divisor_override (window sums
    over a fixed divisor) and padding, then a linear head."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.head = nn.Linear(4 * 4 * 4, CLASSES)

    def forward(self, x):
        h = F.avg_pool2d(torch.tanh(self.conv(x)), 3, stride=2, padding=1, divisor_override=5)
        return self.head(h.flatten(1))


def exporter_gap_entries():
    """Calls the dynamo exporter writes as something else (the importer
    reads the call from the node's metadata)."""
    def entry(name, make, cls):
        return Entry(name, "torch.nn", cls, lambda: (make(), scatter_sample, WithIndexLoss,
                                                     LOSS_ROWS))
    return [
        Entry("avg_pool_divisor", "torch.nn", "torch.nn.functional.avg_pool2d",
              lambda: (AvgPoolDivisor(), functools.partial(image_sample, size=8, key="x"),
                       WithLoss, LOSS_ROWS)),
        entry("scatter_mean", lambda: ScatterMean(True), "torch.Tensor.scatter_reduce"),
        entry("scatter_mean_no_self", lambda: ScatterMean(False), "torch.Tensor.scatter_reduce"),
    ]


# --------------------------------------------------------------------------
# torch.nn's layers

# One small network per torch.nn layer (or option of one) that the other
# families do not exercise as a user writes it: each layer between the
# input and a linear head, trained with cross-entropy. Family
# `torch.nn layers`; images are [n, 3, 8, 8], sequences [n, 6, 8].
LAYER_IMAGE = (3, 8, 8)
LAYER_SEQ = (6, 8)


class LayerNet(nn.Module):
    """body, flattened, then a linear head sized by one probe call."""

    def __init__(self, body, shape, ints=False):
        super().__init__()
        self.body = body
        probe = (torch.randint(0, 50, (2,) + shape) if ints else torch.randn((2,) + shape))
        was = body.training
        body.eval()
        with torch.no_grad():
            width = body(probe).flatten(1).shape[1]
        body.train(was)
        self.head = nn.Linear(width, CLASSES)

    def forward(self, x):
        return self.head(self.body(x).flatten(1))


class Seq(nn.Module):
    """A recurrent module's output sequence (its states dropped)."""

    def __init__(self, rnn):
        super().__init__()
        self.rnn = rnn

    def forward(self, x):
        return self.rnn(x)[0]


class Pair(nn.Module):
    """fn(a(x), b(x)) for two linear maps of the sequence's first step."""

    def __init__(self, fn, out=8):
        super().__init__()
        self.a = nn.Linear(8, out)
        self.b = nn.Linear(8, out)
        self.fn = fn

    def forward(self, x):
        return self.fn(self.a(x[:, 0]), self.b(x[:, 0])).reshape(x.shape[0], -1)


class Activations(nn.Module):
    """A linear map, then every elementwise activation torch.nn has (but
    RReLU, random in train()), side by side."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.acts = nn.ModuleList([
            nn.Softmin(-1), nn.Softsign(), nn.Tanhshrink(), nn.Threshold(0.1, -1.0),
            nn.Hardtanh(-0.5, 0.7), nn.ReLU6(), nn.GLU(), nn.Mish(), nn.Hardswish(),
            nn.Hardsigmoid(), nn.SiLU(), nn.CELU(0.7), nn.ELU(0.5), nn.SELU(),
            nn.GELU(approximate="tanh"), nn.LogSigmoid(), nn.Softplus(2.0, 5.0),
            nn.Softshrink(0.3), nn.Hardshrink(0.3), nn.LeakyReLU(0.2), nn.LogSoftmax(-1)])

    def forward(self, x):
        h = self.lin(x) * 2
        return torch.cat([a(h) for a in self.acts], -1)


class Paddings(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 2, 1)
        self.pads = nn.ModuleList([nn.ReflectionPad2d(1), nn.ReplicationPad2d((1, 2, 0, 1)),
                                   nn.CircularPad2d(1), nn.ZeroPad2d((2, 0, 1, 1))])

    def forward(self, x):
        h = self.conv(x)
        return torch.cat([p(h).flatten(1) for p in self.pads], 1)


class FoldUnfold(nn.Module):
    def __init__(self):
        super().__init__()
        self.unfold = nn.Unfold(2, stride=2)
        self.mix = nn.Linear(12, 12)
        self.fold = nn.Fold((8, 8), 2, stride=2)

    def forward(self, x):
        return self.fold(self.mix(self.unfold(x).transpose(1, 2)).transpose(1, 2))


class Unpool(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.pool = nn.MaxPool2d(2, return_indices=True)
        self.unpool = nn.MaxUnpool2d(2)

    def forward(self, x):
        h, idx = self.pool(torch.tanh(self.conv(x)))
        return self.unpool(h, idx)


class AdaptivePools(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.max = nn.AdaptiveMaxPool2d((3, 5))
        self.avg = nn.AdaptiveAvgPool2d((4, 3))

    def forward(self, x):
        h = self.conv(x)
        return torch.cat([self.max(h).flatten(1), self.avg(h).flatten(1)], 1)


class Volume(nn.Module):
    """The image as a [3, 4, 4, 4] volume: Conv3d, MaxPool3d, AvgPool3d."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv3d(3, 4, 3, padding=1)
        self.max = nn.MaxPool3d(2)
        self.avg = nn.AvgPool3d((1, 2, 2), stride=1)

    def forward(self, x):
        return self.avg(self.max(torch.tanh(self.conv(x.reshape(-1, 3, 4, 4, 4)))))


class TransformerSeq(nn.Module):
    """nn.Transformer, encoder and decoder, the decoder causal."""

    def __init__(self):
        super().__init__()
        self.t = nn.Transformer(8, 2, 1, 1, 16, dropout=0.0, batch_first=True)

    def forward(self, x):
        mask = nn.Transformer.generate_square_subsequent_mask(x.shape[1])
        return self.t(x, x[:, :4], tgt_mask=mask[:4, :4], tgt_is_causal=True)


class DecoderLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = nn.TransformerDecoderLayer(8, 2, 16, dropout=0.0, batch_first=True,
                                                norm_first=True)

    def forward(self, x):
        mask = nn.Transformer.generate_square_subsequent_mask(x.shape[1])
        return self.layer(x, x * 0.5, tgt_mask=mask, tgt_is_causal=True)


class Bags(nn.Module):
    """EmbeddingBag over fixed-length bags: a mean, and a sum weighted per
    sample."""

    def __init__(self):
        super().__init__()
        self.mean = nn.EmbeddingBag(50, 8, mode="mean")
        self.sum = nn.EmbeddingBag(50, 8, mode="sum")
        self.w = nn.Linear(1, 1)

    def forward(self, x):
        weights = torch.sigmoid(self.w(x.float().unsqueeze(-1) / 50)).squeeze(-1)
        return torch.cat([self.mean(x), self.sum(x, per_sample_weights=weights)], 1)


class TensorOps(nn.Module):
    """cumsum, flip, roll, sort, tril, a masked fill and a clamp between
    learned maps of the sequence (cumprod exports with neither exporter)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        h = torch.tanh(self.lin(x))
        s = torch.sort(h, dim=-1).values
        sq = h[:, :6, :6]
        return torch.cat([torch.cumsum(h, 1), h.flip(1),
                          h.roll(2, -1), s, F.pad(torch.tril(sq), (0, 2)),
                          h.masked_fill(h > 0.5, 0.25), h.clamp(-0.3, 0.4)], 1)


def seq_sample(gen, n):
    return collections.OrderedDict([
        ("x", torch.randn((n,) + LAYER_SEQ, generator=gen)),
        ("labels", torch.randint(0, CLASSES, (n,), generator=gen, dtype=torch.int64))])


def bag_sample(gen, n):
    return collections.OrderedDict([
        ("x", torch.randint(0, 50, (n, 5), generator=gen)),
        ("labels", torch.randint(0, CLASSES, (n,), generator=gen, dtype=torch.int64))])


def layer_entries():
    """torch.nn's layers (the table above), one entry each."""
    P = nn.utils.parametrizations
    image = functools.partial(image_sample, size=8, key="x")

    def entry(name, make, cls, kind="image"):
        shape, sample = {"image": (LAYER_IMAGE, image), "seq": (LAYER_SEQ, seq_sample),
                         "bag": ((5,), bag_sample)}[kind]
        return Entry("layer_" + name, "torch.nn layers", cls,
                     lambda: (LayerNet(make(), shape, ints=kind == "bag"), sample, WithLoss,
                              LOSS_ROWS))

    def conv_then(layer, out=4, k=3):
        return lambda: nn.Sequential(nn.Conv2d(3, out, k), layer())

    return [
        entry("conv_same_dilated_groups",
              lambda: nn.Sequential(nn.Conv2d(3, 6, 3, padding="same", dilation=2, groups=3),
                                    nn.Tanh()), "torch.nn.Conv2d"),
        entry("conv3d_pools", Volume, "torch.nn.Conv3d"),
        entry("conv_transpose_groups",
              lambda: nn.ConvTranspose2d(3, 6, 3, stride=2, padding=1, output_padding=1,
                                         groups=3), "torch.nn.ConvTranspose2d"),
        entry("group_norm", conv_then(lambda: nn.GroupNorm(2, 4)), "torch.nn.GroupNorm"),
        entry("instance_norm_running",
              conv_then(lambda: nn.InstanceNorm2d(4, affine=True, track_running_stats=True)),
              "torch.nn.InstanceNorm2d"),
        entry("local_response_norm", conv_then(lambda: nn.LocalResponseNorm(3), out=6),
              "torch.nn.LocalResponseNorm"),
        entry("layer_norm_no_affine",
              conv_then(lambda: nn.LayerNorm([4, 6, 6], elementwise_affine=False)),
              "torch.nn.LayerNorm"),
        entry("rms_norm", lambda: nn.Sequential(nn.Linear(8, 8), nn.RMSNorm(8)),
              "torch.nn.RMSNorm", "seq"),
        entry("pixel_shuffle",
              lambda: nn.Sequential(nn.Conv2d(3, 12, 1), nn.PixelShuffle(2), nn.Tanh(),
                                    nn.PixelUnshuffle(2)), "torch.nn.PixelShuffle"),
        entry("upsample_bilinear_corners",
              conv_then(lambda: nn.Upsample(scale_factor=2, mode="bilinear", align_corners=True),
                        k=1), "torch.nn.Upsample"),
        entry("upsample_bicubic",
              conv_then(lambda: nn.Upsample(scale_factor=1.5, mode="bicubic"), k=1),
              "torch.nn.Upsample"),
        entry("upsample_nearest_size", conv_then(lambda: nn.Upsample(size=(12, 10)), k=1),
              "torch.nn.Upsample"),
        entry("fold_unfold", FoldUnfold, "torch.nn.Fold"),
        entry("adaptive_pools", AdaptivePools, "torch.nn.AdaptiveMaxPool2d"),
        entry("lp_pool", conv_then(lambda: nn.LPPool2d(2, 2)), "torch.nn.LPPool2d"),
        entry("prelu_channels", conv_then(lambda: nn.PReLU(4)), "torch.nn.PReLU"),
        entry("channel_shuffle", conv_then(lambda: nn.ChannelShuffle(3), out=6, k=1),
              "torch.nn.ChannelShuffle"),
        entry("paddings", Paddings, "torch.nn.ReflectionPad2d"),
        entry("max_unpool", Unpool, "torch.nn.MaxUnpool2d"),
        entry("weight_norm", lambda: P.weight_norm(nn.Conv2d(3, 4, 3)),
              "torch.nn.utils.parametrizations.weight_norm"),
        entry("spectral_norm", lambda: nn.Sequential(nn.Flatten(), P.spectral_norm(
            nn.Linear(3 * 8 * 8, 16))), "torch.nn.utils.parametrizations.spectral_norm"),
        entry("orthogonal", lambda: nn.Sequential(nn.Linear(8, 8), P.orthogonal(nn.Linear(8, 8))),
              "torch.nn.utils.parametrizations.orthogonal", "seq"),
        entry("gru_bidirectional",
              lambda: Seq(nn.GRU(8, 8, 2, batch_first=True, bidirectional=True)),
              "torch.nn.GRU", "seq"),
        entry("lstm_proj", lambda: Seq(nn.LSTM(8, 8, batch_first=True, proj_size=4)),
              "torch.nn.LSTM", "seq"),
        entry("rnn_relu", lambda: Seq(nn.RNN(8, 8, nonlinearity="relu", batch_first=True)),
              "torch.nn.RNN", "seq"),
        entry("activations", Activations, "torch.nn activations", "seq"),
        entry("bilinear", lambda: Pair(nn.Bilinear(8, 8, 6)), "torch.nn.Bilinear", "seq"),
        entry("distances", lambda: Pair(lambda a, b: torch.stack(
            [nn.CosineSimilarity(-1)(a, b), nn.PairwiseDistance(p=1)(a, b),
             nn.PairwiseDistance(p=2)(a, b)], 1)), "torch.nn.PairwiseDistance", "seq"),
        entry("transformer", TransformerSeq, "torch.nn.Transformer", "seq"),
        entry("transformer_decoder_layer", DecoderLayer, "torch.nn.TransformerDecoderLayer",
              "seq"),
        entry("embedding_max_norm", lambda: nn.Embedding(50, 8, max_norm=1.0),
              "torch.nn.Embedding", "bag"),
        entry("embedding_bag", Bags, "torch.nn.EmbeddingBag", "bag"),
        entry("tensor_ops", TensorOps, "torch (tensor ops)", "seq"),
    ]
