"""The text side of a loaded model: :class:`TextTokenizer`, one wrapper over a ``tokenizers``
tokenizer (a run's ``tokenizer.json`` or a Hugging Face one) naming its special tokens, and
:func:`export_token_ids`, the start/end/pad ids a Hugging Face export writes. Framework-free: no
model is run here (``jaxformer.loading`` hands a ``TextTokenizer`` out with every model).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

__all__ = ["TextTokenizer", "export_token_ids"]

# The special tokens a TextTokenizer names, each with the spellings it is found under: jaxformer's
# own vocabularies (training.vocab.SPECIAL_TOKENS), BERT's, GPT-2's and RoBERTa/T5-style ones.
_SPECIALS = {
    "pad_id": ("[PAD]", "<pad>"),
    "unk_id": ("[UNK]", "<unk>"),
    "cls_id": ("[CLS]", "<s>"),
    "sep_id": ("[SEP]", "</s>"),
    "mask_id": ("[MASK]", "<mask>"),
    "eos_id": ("<|endoftext|>", "</s>", "[SEP]"),
    "bos_id": ("<|endoftext|>", "<s>", "[CLS]"),
}


class TextTokenizer:
    """One wrapper over a ``tokenizers.Tokenizer`` (a run's ``tokenizer.json`` or a Hugging Face
    one), without padding or truncation.

    ``encode(text)`` gives the ids of the text alone, without special tokens, as training encodes
    its data (``training.data.encode``); the commands add ``[CLS]``/``[SEP]`` as each task does.
    A character vocabulary (``is_char``) refuses a character it does not know with a
    ``ValueError`` naming the characters and their positions (the tokenizer alone would drop them
    in silence); WordPiece maps an unknown word to ``[UNK]``, byte-level BPE knows every text.

    The special ids are ``None`` when the vocabulary lacks the token. ``eos_id`` is the token that
    ends a text: GPT-2's ``<|endoftext|>``, ``</s>``, or ``[SEP]`` (jaxformer's GPT stream ends each
    line with it; the encoder-decoder ends each target with it); ``bos_id`` the one that starts
    it (``[CLS]``, the encoder-decoder's decoder start). ``specials`` overrides any of them
    (a Hugging Face ``config.json``'s ``eos_token_id``...).
    """

    def __init__(self, backend, specials: Mapping[str, int | None] | None = None):
        from jaxformer.training.vocab import is_char_tokenizer

        self.backend = backend  # the tokenizers.Tokenizer
        backend.no_padding()
        backend.no_truncation()
        self.is_char: bool = is_char_tokenizer(backend)
        self.vocab_size: int = backend.get_vocab_size()
        for name, spellings in _SPECIALS.items():
            found = [backend.token_to_id(s) for s in spellings]
            setattr(self, name, next((i for i in found if i is not None), None))
        if self.is_char:  # a character vocabulary has no special token, whatever its characters
            for name in _SPECIALS:
                setattr(self, name, None)
        for name, value in (specials or {}).items():
            if name not in _SPECIALS:
                raise ValueError(f"unknown special token {name!r}; one of {sorted(_SPECIALS)}")
            if value is not None:
                setattr(self, name, value)

    pad_id: int | None
    unk_id: int | None
    cls_id: int | None
    sep_id: int | None
    mask_id: int | None
    eos_id: int | None
    bos_id: int | None

    def encode(self, text: str) -> list[int]:
        if self.is_char:
            self._check_chars(text)
        return list(self.backend.encode(text, add_special_tokens=False).ids)

    def _check_chars(self, text: str) -> None:
        vocab = self.backend.get_vocab()
        unknown = [(i, c) for i, c in enumerate(text) if c not in vocab]
        if unknown:
            chars = sorted({c for _, c in unknown})
            shown = ", ".join(f"{c!r} (U+{ord(c):04X})" for c in chars[:10])
            where = ", ".join(str(i) for i, _ in unknown[:10])
            more = f" and {len(unknown) - 10} more" if len(unknown) > 10 else ""
            raise ValueError(f"{len(chars)} character(s) outside the {self.vocab_size}-character "
                             f"vocabulary: {shown}, at position(s) {where}{more}")

    def decode(self, ids) -> str:
        return self.backend.decode([int(i) for i in ids], skip_special_tokens=False)

    def token_to_id(self, token: str) -> int | None:
        return self.backend.token_to_id(token)

    def id_to_token(self, i: int) -> str | None:
        return self.backend.id_to_token(int(i))

    def __repr__(self) -> str:
        kind = "char" if self.is_char else "subword"
        return f"TextTokenizer({kind}, vocab_size={self.vocab_size}, eos_id={self.eos_id})"


def export_token_ids(model, tokenizer) -> dict[str, int | None]:
    """``config.json``'s ``bos_token_id``, ``eos_token_id`` and ``pad_token_id`` for exporting
    ``model`` with ``tokenizer`` (a TextTokenizer, a ``tokenizers.Tokenizer`` or the path of a
    ``tokenizer.json``). A GPT ends and separates texts with the tokenizer's end token (the
    ``[SEP]`` that ends every line of jaxformer's GPT stream; GPT-2's ``<|endoftext|>``), which is
    its ``bos`` too, as GPT-2's; its ``pad`` is the tokenizer's. A BERT ends a text with
    ``[SEP]`` and starts it with ``[CLS]``; its ``pad`` is its config's. A character vocabulary
    has no end token: None (nanoGPT's model never stops either)."""
    if isinstance(tokenizer, str | Path):
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_file(str(tokenizer))
    if not isinstance(tokenizer, TextTokenizer):
        tokenizer = TextTokenizer(tokenizer)
    if type(model).__name__ == "GPT":
        return {"eos_token_id": tokenizer.eos_id, "bos_token_id": tokenizer.eos_id,
                "pad_token_id": tokenizer.pad_id}
    if type(model).__name__ == "Transformer":  # the transformer task's start and end tokens
        return {"decoder_start_token_id": tokenizer.cls_id, "eos_token_id": tokenizer.sep_id,
                "pad_token_id": tokenizer.pad_id}
    return {"eos_token_id": tokenizer.sep_id, "bos_token_id": tokenizer.cls_id}
