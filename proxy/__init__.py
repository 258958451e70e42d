"""ragtoll.proxy: the transparent budget-enforcing HTTP proxy (the sidecar).

Imports nothing at package level so `python -m ragtoll.proxy` and the CLI start fast.
"""

__version__ = "0.1.0"
