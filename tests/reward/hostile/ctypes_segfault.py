# ruff: noqa  (hostile test program with placeholders, not project code)
# expect: program_error
import ctypes

ctypes.string_at(0)
