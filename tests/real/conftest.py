"""tests/real/verl_cpu.py is verl's platform plugin (it imports torch and verl at import):
not a module for the doctest collection of the main suite's environment."""

collect_ignore = ["verl_cpu.py"]
