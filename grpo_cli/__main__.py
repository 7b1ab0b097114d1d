"""``python -m grpo_cli``."""

from .cli import main

main()
