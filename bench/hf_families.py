"""Hugging Face model families from their published configs (real widths, heads and FFN sizes; two layers), built on
any device: what the CPU capture test compiles every kernel of (tests/python/test_hf_kernels_compile.py) and what the
kernel pack's structure list is captured from (scripts/kernel_pack_structures.py). Needs transformers."""
import torch
import transformers

TOKENS = (16, 512)   # batch x sequence of the language models (docs/pytorch.md's benchmark)


def _lm(cls_name, **cfg):
    def build():
        t = transformers
        config_cls = getattr(t, cls_name.replace("Model", "Config"))
        config = config_cls(**cfg)
        # (no key / value cache: the CPU capture test's forward; scripts/kernel_pack_structures.py --device cuda also
        # captures each decoder with its cache, as the benchmark and a default call run it)
        config.use_cache = False
        return getattr(t, cls_name)(config), (torch.zeros(*TOKENS, dtype=torch.long),)
    return build


def _vit():
    t = transformers
    cfg = t.ViTConfig(hidden_size=768, num_hidden_layers=2, num_attention_heads=12, intermediate_size=3072,
                      image_size=224, patch_size=16)
    return t.ViTModel(cfg, add_pooling_layer=False), (torch.zeros(64, 3, 224, 224),)


# Published configs (the model cards' config.json), two layers.
FAMILIES = {
    "bert-base": _lm("BertModel", hidden_size=768, num_hidden_layers=2, num_attention_heads=12, intermediate_size=3072),
    "roberta-base": _lm("RobertaModel", hidden_size=768, num_hidden_layers=2, num_attention_heads=12,
                        intermediate_size=3072, max_position_embeddings=514, vocab_size=50265),
    "gpt2": _lm("GPT2Model", n_embd=768, n_layer=2, n_head=12),
    "llama-7b": _lm("LlamaModel", hidden_size=4096, num_hidden_layers=2, num_attention_heads=32, intermediate_size=11008,
                    vocab_size=32000),
    "vit-base": _vit,
    "qwen2-0.5b (GQA, biased QKV)": _lm("Qwen2Model", hidden_size=896, num_hidden_layers=2, num_attention_heads=14,
                                        num_key_value_heads=2, intermediate_size=4864, vocab_size=151936),
    "mistral-7b (GQA)": _lm("MistralModel", hidden_size=4096, num_hidden_layers=2, num_attention_heads=32,
                            num_key_value_heads=8, intermediate_size=14336, vocab_size=32000),
    "opt-350m": _lm("OPTModel", hidden_size=1024, num_hidden_layers=2, num_attention_heads=16, ffn_dim=4096,
                    word_embed_proj_dim=512, do_layer_norm_before=False, vocab_size=50272),
    "opt-1.3b (pre-norm)": _lm("OPTModel", hidden_size=2048, num_hidden_layers=2, num_attention_heads=32, ffn_dim=8192,
                                word_embed_proj_dim=2048, do_layer_norm_before=True, vocab_size=50272),
    "pythia-410m (GPT-NeoX, partial rotary)": _lm("GPTNeoXModel", hidden_size=1024, num_hidden_layers=2,
                                                  num_attention_heads=16, intermediate_size=4096, rotary_pct=0.25,
                                                  vocab_size=50304),
    "gemma-2b (GeGLU, one key / value head of 256)": _lm("GemmaModel", hidden_size=2048, num_hidden_layers=2,
                                                         num_attention_heads=8, num_key_value_heads=1, head_dim=256,
                                                         intermediate_size=16384, vocab_size=256000),
}
