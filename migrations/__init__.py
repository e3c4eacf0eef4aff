"""Numbered plain-SQL migrations, applied in order by `trainyard migrate`."""
