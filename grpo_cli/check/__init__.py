"""The check's pieces below the commands: its configuration and verdicts, its scan, its
rules and their table, the baseline."""
