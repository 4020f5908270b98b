"""`python -m keras_posenc`: the `keras-posenc` command."""

import sys

from keras_posenc.cli import main

sys.exit(main())
