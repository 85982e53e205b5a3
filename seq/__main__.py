"""``python -m seq ...``: the ``seq`` command, for a PATH where another ``seq`` comes first
(coreutils' ``seq`` on Linux, ``/usr/bin/seq`` on macOS). A missing extra is one line naming it
(``sequence_ai.extras.seq_main``, the ``seq`` console script)."""
import sys

from sequence_ai.extras import seq_main as main

if __name__ == "__main__":
    sys.exit(main())
