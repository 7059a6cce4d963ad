# ruff: noqa  (hostile test program with placeholders, not project code)
# expect: ok
# Reads host files directly and through symlinks, hard links and /proc: the canary (world-readable), the repository, the host's temp folder of sandboxes (__HOSTTMP__), /etc/shadow, $HOME.
import glob
import os

found = []
targets = ["__CANARY__", "__REPO__/pyproject.toml", "/etc/shadow", "/etc/passwd", "/root/.bashrc"]
targets += ["/proc/1/root__CANARY__", "/proc/self/root__CANARY__", "/proc/1/cwd/__CANARY__"]
for i, path in enumerate(targets):
    for how in ("open", "symlink", "link"):
        try:
            if how == "open":
                p = path
            else:
                p = f"/tmp/{how}{i}"
                (os.symlink if how == "symlink" else os.link)(path, p)
            with open(p, "rb") as f:
                found.append(f.read(64))
        except OSError:
            pass
for pat in ("__REPO__/*", "__HOSTTMP__/*", "/home/*", "/root/*", os.path.expanduser("~") + "/.*"):
    found += glob.glob(pat)
print("PWNED" if found else "nothing")
