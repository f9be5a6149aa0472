"""preflight: decides, in seconds, whether a GPU node will run a training job at full speed."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("preflight")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0+unknown"
