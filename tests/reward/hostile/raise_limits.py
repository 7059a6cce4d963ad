# ruff: noqa  (hostile test program with placeholders, not project code)
# expect: program_error
import resource

for res in (resource.RLIMIT_AS, resource.RLIMIT_NPROC, resource.RLIMIT_CPU, resource.RLIMIT_FSIZE):
    resource.setrlimit(res, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
print("PWNED")
