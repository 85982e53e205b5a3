"""``python -m sequence_ai ...``: the ``sequence-ai`` command (doctor, models, account, version)."""
import sys

from sequence_ai.cli import main

if __name__ == "__main__":
    sys.exit(main())
