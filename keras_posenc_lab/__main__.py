"""`python -m keras_posenc_lab`: the `keras-posenc` command."""

import sys

from keras_posenc_lab.cli import main

sys.exit(main())
