"""Weights in and out: ``convert`` (a ``torch_ref`` state_dict <-> an NNX model) and ``hf``
(Hugging Face directories). The rules are in `docs/design.md` ("The mirror") and
`docs/huggingface.md`."""
