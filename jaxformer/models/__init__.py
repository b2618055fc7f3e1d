"""The three families, one file each: ``bert``, ``encoder_decoder``, ``gpt``; FLOP counts in
``flops``. Twin: ``torch_ref/models``."""
