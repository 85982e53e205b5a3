"""``python -m sequence_ai_server.gateway``: the gateway process (main.py's main)."""
import sys

from sequence_ai_server.gateway.main import main

if __name__ == "__main__":
    sys.exit(main())
