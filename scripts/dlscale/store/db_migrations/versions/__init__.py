"""One Alembic script per schema revision of the results database, oldest first."""
