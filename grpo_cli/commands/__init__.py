"""The commands: thin plans composing reading, the fold, the records and the check (each
returns a record; the CLI renders it)."""
