# ruff: noqa  (hostile test program with placeholders, not project code)
# expect: program_error program_timeout
import threading
import time

while True:
    threading.Thread(target=time.sleep, args=(3600,), daemon=True).start()
