"""pdtbench: reference implementations and harness for pruning CNNs during training.

Nothing here touches a GPU at import time.
"""

__version__ = "0.1.0"
