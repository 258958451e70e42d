"""`python -m ragtoll.proxy` is `ragtoll`."""

from .cli import main

raise SystemExit(main())
