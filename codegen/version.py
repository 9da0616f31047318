"""The generator version stamped into banners, manifests and cache keys."""
from importlib.metadata import PackageNotFoundError, version

try:
    VERSION = version("kvforge")
except PackageNotFoundError:  # running from a source tree that was never installed
    VERSION = "0.0.0+unknown"
