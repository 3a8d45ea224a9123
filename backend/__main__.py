"""`python -m backend`: see backend/io/cli.py."""

from backend.io.cli import main

raise SystemExit(main())
