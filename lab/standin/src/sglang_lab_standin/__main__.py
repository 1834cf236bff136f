"""``python -m sglang_lab_standin <launch_server args>``."""

import sys

from .server import main

if __name__ == "__main__":
    sys.exit(main())
