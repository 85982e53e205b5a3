"""``python -m sequence_ai_server.worker``: the worker process (main.py)."""
import sys

from sequence_ai_server.worker.main import main

if __name__ == "__main__":
    sys.exit(main())
