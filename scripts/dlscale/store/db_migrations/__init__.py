"""The results database's schema migrations (Alembic): `env.py` runs them on the connection
dlscale.store.database.ensure_schema hands it; `versions/` holds one script per revision."""
