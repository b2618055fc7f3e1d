"""What every family shares: ``params`` (parameter factories), ``attention``, ``layers``
(feed-forward, Transformer block), ``masks``. Twin: ``torch_ref/nn``."""
