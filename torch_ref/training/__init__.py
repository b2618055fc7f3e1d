"""Twins of ``jaxformer/training``: losses, optimizer, train step and checkpoints in PyTorch.

They read the same ``TrainConfig`` (``jaxformer.training.config``), select the same objective
(``jaxformer.training.tasks``: the model class and loss function named there are looked up here)
and train on the same host-side batches (``jaxformer.training.data``), all framework-free.
"""
