"""`python -m ragtoll.proxy` is `ragtoll`."""

from .cli import main

# guarded: the span export process (instrumentation/export.py) is spawned, and a spawned child
# imports the parent's main module again
if __name__ == "__main__":
    raise SystemExit(main())
