"""preflight: decides, in seconds, whether a GPU node will run a training job at full speed.

The distribution is named gpu-preflight (PyPI's `preflight` is another
project); the command and this package are `preflight`. The version lives
here, not in installed metadata, so reading it costs no metadata scan at
start-up.
"""

__version__ = "0.2.0"
