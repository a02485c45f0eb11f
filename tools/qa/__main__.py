"""``python -m tools.qa run SET.jsonl --variants ... --url ... --out run.jsonl`` (see cli.py)."""

import sys

from .cli import main

sys.exit(main())
