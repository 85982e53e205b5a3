"""``python -m seq ...``: the ``seq`` command, for a PATH where another ``seq`` comes first
(coreutils' ``seq`` on Linux, ``/usr/bin/seq`` on macOS)."""
from seq.cli import main

if __name__ == "__main__":
    main()
