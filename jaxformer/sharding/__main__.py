"""``python -m jaxformer.sharding launch --processes N --local-devices D -- TRAIN_ARGS``: several
``jaxformer train`` processes on this machine (``jaxformer.sharding.launch``)."""

import sys

from jaxformer.sharding.launch import main

if __name__ == "__main__":
    sys.exit(main())
