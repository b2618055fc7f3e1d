"""PyTorch twins of the ``jaxformer`` models: same folders, file names, class names and attributes.

Each module's ``state_dict`` keys equal the dotted NNX parameter paths of its Flax twin (up to the
leaf name), so ``jaxformer.checkpoints.convert`` moves weights between them by four fixed rules.
From ``jaxformer`` it imports only the framework-free modules (``config``, ``validate``,
``numerics``), never JAX code.
"""
