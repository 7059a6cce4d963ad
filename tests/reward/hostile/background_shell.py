# ruff: noqa  (hostile test program with placeholders, not project code)
# expect: ok
# score: 1
# tests: {"inputs": [""], "outputs": ["done"]}
# Leaves a shell job behind with nohup; the answer is right, the job must not survive.
import subprocess

subprocess.Popen(["/bin/sh", "-c", "nohup sleep 300 >/dev/null 2>&1 &"])
print("done")
