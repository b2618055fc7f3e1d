"""Tiny, randomised Hugging Face transformers models for the checkpoint tests.

The sizes are those of ``BertConfig.tiny()`` / ``GPTConfig.tiny()``, so jit caches are shared
with the rest of the suite. Its users, the checkpoint tests, get ``HF_HUB_OFFLINE`` from
``parity_tests/checkpoints/__init__.py``: nothing here touches the network.
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


def randomize(module: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Perturb every parameter (tied ones once): LayerNorm scales off one, biases off zero."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.2 * torch.randn(p.shape, generator=gen))
    return module.eval()


def hf_model(arch: str, config=None, seed: int = 0) -> torch.nn.Module:
    """A randomised transformers model of class ``arch`` (tiny BERT or GPT-2 by default)."""
    if config is None:
        config = hf_gpt2_config() if arch.startswith("GPT2") else hf_bert_config()
    torch.manual_seed(seed)
    return randomize(getattr(transformers, arch)(config), seed)


def fail_writes_halfway(monkeypatch) -> None:
    """Make the safetensors writer leave half a file and raise, as a full disk would."""
    import safetensors.numpy

    def fail_halfway(tensors, filename, metadata=None):
        with open(filename, "wb") as f:
            f.write(b"half a file")
        raise OSError("disk full")

    monkeypatch.setattr(safetensors.numpy, "save_file", fail_halfway)
