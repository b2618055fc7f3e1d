"""PyTorch twins of the ``jaxformer`` models: same file names, class names and attribute names.

Each module's ``state_dict`` keys equal the dotted NNX parameter paths of its Flax twin (up to the
leaf name), so ``jaxformer.convert`` moves weights between them by four fixed rules.
"""
