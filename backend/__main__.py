"""`python -m backend`: see backend/cli.py."""

from backend.cli import main

raise SystemExit(main())
