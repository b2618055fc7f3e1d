"""Twins of ``jaxformer/training``: losses, optimizer, train step and checkpoints in PyTorch.

They read the same ``TrainConfig`` (``jaxformer.training.config``) and train on the same host-side
batches (``jaxformer.training.data``), both framework-free.
"""
