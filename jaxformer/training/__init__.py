"""Training in both frameworks: losses, optimizer and schedules, the train step, checkpoints.

``config`` (the frozen :class:`~jaxformer.training.config.TrainConfig`) and ``data`` (tokenizing
and batching on the host in numpy) are framework-free: ``torch_ref.training`` imports them, so the
two frameworks train from the same hyper-parameters on the very same batches. ``losses``,
``optim``, ``step`` and ``checkpoint`` have twins of the same names in ``torch_ref/training``;
``loop`` drives either framework's step for ``jaxformer train``. See ``docs/training.md``.

Nothing is imported here, so importing a framework-free submodule never loads JAX.
"""
