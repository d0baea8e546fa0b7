"""Tiny Hugging Face configs (2 layers, hidden 64, seq 16) shared by the capture / MoE tests."""
import torch

SEQ, BATCH = 16, 4


def configs():
    """name -> (config, model class, example inputs on meta)."""
    import transformers as T
    c = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128, vocab_size=256,
             max_position_embeddings=64, use_cache=False)
    ids = torch.empty(BATCH, SEQ, dtype=torch.long, device="meta")
    return {
        "llama": (T.LlamaConfig(**c, num_key_value_heads=2), T.LlamaForCausalLM, (ids,)),
        "mistral": (T.MistralConfig(**c, num_key_value_heads=2), T.MistralForCausalLM, (ids,)),
        "qwen2": (T.Qwen2Config(**c, num_key_value_heads=2), T.Qwen2ForCausalLM, (ids,)),
        "gpt-neox": (T.GPTNeoXConfig(**c), T.GPTNeoXForCausalLM, (ids,)),
        "bert": (T.BertConfig(**c), T.BertForMaskedLM, (ids,)),
        "vit": (T.ViTConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128,
                            image_size=32, patch_size=8), T.ViTForImageClassification,
                (torch.empty(BATCH, 3, 32, 32, device="meta"),)),
        "t5": (T.T5Config(num_layers=2, num_decoder_layers=2, d_model=64, num_heads=4, d_kv=16, d_ff=128,
                          vocab_size=256, use_cache=False), T.T5ForConditionalGeneration,
               (ids, torch.empty(BATCH, SEQ, dtype=torch.long, device="meta"), ids)),
        "mixtral": (T.MixtralConfig(**c, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2),
                    T.MixtralForCausalLM, (ids,)),
    }


def build(name):
    cfg, cls, inputs = configs()[name]
    with torch.device("meta"):
        return cls(cfg), inputs, cfg
