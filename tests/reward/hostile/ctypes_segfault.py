# ruff: noqa  (hostile test program with placeholders, not project code)
# expect: error
import ctypes

ctypes.string_at(0)
