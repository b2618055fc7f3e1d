"""``python -m jaxformer.sharding train|launch``: the demo trainer and its local launcher.

The command lives in ``jaxformer.sharding.demo`` (``docs/scale.md``); this file only runs it, so
that importing the ``jaxformer.sharding`` package never pulls in the training code.
"""

import sys

from jaxformer.sharding.demo import main

if __name__ == "__main__":
    sys.exit(main())
