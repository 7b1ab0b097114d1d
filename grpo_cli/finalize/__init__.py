"""Partials to records: one constructor each, with their warnings."""
