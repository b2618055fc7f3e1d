"""Training in both frameworks: losses, optimizer and schedules, the train step, the loop.

``config``, ``vocab``, ``data``, ``tasks`` (one Task per objective) and ``synthetic`` are
framework-free: ``torch_ref.training`` imports them, so both frameworks train alike on the very
same batches. ``losses``, ``optim``, ``step`` and ``checkpoint`` have torch twins; ``loop``,
``rundir``, ``reporting`` and ``command`` are ``jaxformer train``. Nothing is imported here.
"""
