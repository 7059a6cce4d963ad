"""Code rewards: the program is extracted, run in a bubblewrap sandbox and judged on its test cases."""
