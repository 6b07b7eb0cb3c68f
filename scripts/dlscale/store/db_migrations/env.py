"""Alembic's environment for the results database: the migrations run on the connection that
dlscale.store.database.ensure_schema opened (inside its transaction and lock), never on a URL
of their own. A new revision: `alembic -c <an ini naming this folder> revision --autogenerate`
against a database at the current head compares the schema with
dlscale.store.results_schema.metadata."""

from alembic import context

from dlscale.store.results_schema import metadata

connection = context.config.attributes.get("connection")
if connection is None:
    raise RuntimeError(
        "the results database's migrations run through dlscale.store.database.ensure_schema "
        "(dlscale.store.database.connect), which hands them a connection"
    )
context.configure(
    connection=connection,
    target_metadata=metadata,
    render_as_batch=connection.dialect.name == "sqlite",  # SQLite alters tables by copy
)
with context.begin_transaction():
    context.run_migrations()
