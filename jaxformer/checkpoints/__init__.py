"""Weights in and out: ``convert`` (torch_ref state_dict <-> NNX) and ``hf`` (Hugging Face
directories)."""
