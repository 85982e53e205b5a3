"""``python -m sequence_ai_server.gateway``: the gateway process (controller.py's main)."""
import sys

from sequence_ai_server.gateway.controller import main

if __name__ == "__main__":
    sys.exit(main())
