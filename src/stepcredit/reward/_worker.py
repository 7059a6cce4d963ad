"""``python -m stepcredit.reward._worker FD``: one worker of the kill-safe pool (see ``pool.py``)."""

import sys

from stepcredit.reward.pool import worker_main

if __name__ == "__main__":
    worker_main(int(sys.argv[1]))
