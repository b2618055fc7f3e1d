"""Tiny, randomised Hugging Face transformers models for the checkpoint tests.

The sizes are those of ``BertConfig.tiny()`` / ``GPTConfig.tiny()`` /
``TransformerConfig.tiny()``, so jit caches are shared with the rest of the suite. Its users, the
checkpoint tests, get ``HF_HUB_OFFLINE`` from ``parity_tests/checkpoints/__init__.py``: nothing
here touches the network.
"""

from __future__ import annotations

import torch
import transformers

transformers.utils.logging.disable_progress_bar()


def hf_bert_config(**overrides) -> transformers.BertConfig:
    return transformers.BertConfig(**{
        "vocab_size": 99, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
        "intermediate_size": 37, "max_position_embeddings": 64, "type_vocab_size": 3,
        "num_labels": 3, **overrides})


def hf_gpt2_config(**overrides) -> transformers.GPT2Config:
    return transformers.GPT2Config(**{
        "vocab_size": 101, "n_embd": 32, "n_layer": 2, "n_head": 4, "n_positions": 64,
        "n_inner": 37, "bos_token_id": None, "eos_token_id": None, **overrides})


def hf_marian_config(**overrides) -> transformers.MarianConfig:
    """The sizes of ``TransformerConfig.tiny()``, MarianMT's own choices (swish, scaled shared
    embeddings, pad = decoder start); pad 28 is the last id, as in the Helsinki-NLP models."""
    return transformers.MarianConfig(**{
        "vocab_size": 29, "d_model": 32, "encoder_layers": 2, "decoder_layers": 2,
        "encoder_attention_heads": 4, "decoder_attention_heads": 4, "encoder_ffn_dim": 37,
        "decoder_ffn_dim": 37, "max_position_embeddings": 64, "activation_function": "swish",
        "scale_embedding": True, "pad_token_id": 28, "decoder_start_token_id": 28,
        "eos_token_id": 0, "forced_eos_token_id": 0, **overrides})


def hf_bart_config(**overrides) -> transformers.BartConfig:
    """The sizes of ``TransformerConfig.tiny()`` with BART's defaults (GELU, no scale, pad 1,
    eos 2 = decoder start)."""
    return transformers.BartConfig(**{
        "vocab_size": 29, "d_model": 32, "encoder_layers": 2, "decoder_layers": 2,
        "encoder_attention_heads": 4, "decoder_attention_heads": 4, "encoder_ffn_dim": 37,
        "decoder_ffn_dim": 37, "max_position_embeddings": 64, **overrides})


def randomize(module: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Perturb every parameter (tied ones once): LayerNorm scales off one, biases off zero."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            if p.requires_grad:  # not Marian's frozen sinusoidal tables, which are constants
                p.add_(0.2 * torch.randn(p.shape, generator=gen))
    return module.eval()


def hf_model(arch: str, config=None, seed: int = 0) -> torch.nn.Module:
    """A randomised transformers model of class ``arch`` (tiny BERT or GPT-2 by default)."""
    if config is None:
        config = {"GPT2": hf_gpt2_config, "Bert": hf_bert_config, "Bart": hf_bart_config,
                  "Mari": hf_marian_config}[arch[:4]]()
    torch.manual_seed(seed)
    model = randomize(getattr(transformers, arch)(config), seed)
    if hasattr(model, "final_logits_bias"):  # a buffer, not a parameter: perturb it too
        gen = torch.Generator().manual_seed(seed + 1)
        model.final_logits_bias.add_(0.2 * torch.randn(model.final_logits_bias.shape,
                                                       generator=gen))
    return model


def fail_writes_halfway(monkeypatch) -> None:
    """Make the safetensors writer leave half a file and raise, as a full disk would."""
    import safetensors.numpy

    def fail_halfway(tensors, filename, metadata=None):
        with open(filename, "wb") as f:
            f.write(b"half a file")
        raise OSError("disk full")

    monkeypatch.setattr(safetensors.numpy, "save_file", fail_halfway)
