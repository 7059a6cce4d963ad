"""The built-in tiny model: a Llama-architecture causal LM with a character-level tokenizer.

Everything is built from a config in code, so it needs no download. The tokenizer is a
``tokenizers`` BPE model with no merges (so every character is one token, and offsets map tokens
back to characters exactly) wrapped in ``PreTrainedTokenizerFast`` with pad/bos/eos tokens and a
chat template.
"""

from __future__ import annotations

from typing import Any

from stepcredit.config import TinyModelConfig

SPECIAL_TOKENS = ["<pad>", "<s>", "</s>", "<unk>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]
CHARS = [chr(i) for i in range(32, 127)] + ["\n", "\t"]

# A user turn ends with <|end|>; the assistant's reply ends with eos. The generation prompt is the
# assistant tag, so a response starts right after it.
CHAT_TEMPLATE = (
    "{% for m in messages %}"
    "{% if m['role'] == 'system' %}<|system|>{{ m['content'] }}<|end|>"
    "{% elif m['role'] == 'user' %}<|user|>{{ m['content'] }}<|end|>"
    "{% else %}<|assistant|>{{ m['content'] }}</s>{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def build_tokenizer() -> Any:
    """A character-level fast tokenizer (vocabulary: specials + printable ASCII + newline + tab)."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS + CHARS)}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    core.add_special_tokens(SPECIAL_TOKENS)
    core.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        unk_token="<unk>",
        clean_up_tokenization_spaces=False,
    )
    tok.chat_template = CHAT_TEMPLATE
    tok.padding_side = "left"
    return tok


def build_tiny_model(
    cfg: TinyModelConfig, *, vocab_size: int, seed: int = 0, attn_implementation: str = "sdpa"
) -> Any:
    """A randomly initialised LlamaForCausalLM of the given size (deterministic by seed)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_heads,
        max_position_embeddings=cfg.max_position_embeddings,
        tie_word_embeddings=True,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    config._attn_implementation = attn_implementation
    devnull = torch.random.fork_rng(devices=[])
    with devnull:
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    return model


def build_tiny(cfg: TinyModelConfig, *, seed: int = 0, attn_implementation: str = "sdpa") -> tuple[Any, Any]:
    """(model, tokenizer) of the built-in tiny model."""
    tok = build_tokenizer()
    model = build_tiny_model(cfg, vocab_size=len(tok), seed=seed, attn_implementation=attn_implementation)
    model.generation_config.pad_token_id = tok.pad_token_id
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.bos_token_id = tok.bos_token_id
    return model, tok
