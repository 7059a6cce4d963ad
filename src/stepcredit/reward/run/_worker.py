"""``python -m stepcredit.reward.run._worker FD [PROGRESS_FD]``: one worker of the kill-safe pool (see ``pool.py``)."""

import sys

from stepcredit.reward.run.pool import worker_main

if __name__ == "__main__":
    worker_main(int(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else -1)
