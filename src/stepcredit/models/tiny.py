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


def _wrap(core: Any) -> Any:
    from transformers import PreTrainedTokenizerFast

    core.add_special_tokens(SPECIAL_TOKENS)
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


def build_tokenizer(kind: str = "char", *, vocab_size: int = 400) -> Any:
    """The built-in tokenizer: ``char`` (one token per character) or ``bpe`` (see below)."""
    match kind:
        case "bpe":
            return build_bpe_tokenizer(vocab_size)
    from tokenizers import Tokenizer, decoders, models

    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS + CHARS)}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    core.decoder = decoders.Fuse()
    return _wrap(core)


def build_bpe_tokenizer(vocab_size: int = 400) -> Any:
    """A small BPE tokenizer trained, deterministically and offline, on a fixed corpus of ``arith``
    problems and traces (seed and settings independent of the run's data).

    Words and numbers become single tokens ("▁13.", "▁answer"), so sequences are ~4x shorter than
    with the character tokenizer, which makes generation and training on a CPU that much cheaper.
    Every printable ASCII character stays in the vocabulary, so any ASCII text still encodes; other
    characters map to ``<unk>``. Spaces are kept as ``▁`` (Metaspace), so offsets and decoding are exact.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from stepcredit.config import ArithConfig
    from stepcredit.data.arith import make_rows

    rows = make_rows(
        ArithConfig(min_steps=1, max_steps=6, max_operand=20, mistake_prob=0.3),
        3000,
        seed=12345,
        split="tokenizer",
    )
    corpus = [r["prompt"][0]["content"] for r in rows] + [r["extra_info"]["solution"] for r in rows]
    core = Tokenizer(models.BPE(unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="never")
    core.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="never")
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=[*CHARS, "▁"],
        show_progress=False,
    )
    core.train_from_iterator(corpus, trainer)
    return _wrap(core)


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
    tok = build_tokenizer(cfg.tokenizer, vocab_size=cfg.bpe_vocab_size)
    model = build_tiny_model(cfg, vocab_size=len(tok), seed=seed, attn_implementation=attn_implementation)
    model.generation_config.pad_token_id = tok.pad_token_id
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.bos_token_id = tok.bos_token_id
    return model, tok
