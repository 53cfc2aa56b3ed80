"""A throwaway PostgreSQL database per test, on the server ``.ci/run`` starts
(``TUNER_TEST_POSTGRES_URL``, a superuser's URL to its ``postgres`` database)."""
from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

ENV = "TUNER_TEST_POSTGRES_URL"


def _admin(url: str):  # noqa: ANN202
    import sqlalchemy

    from tuner.study.locks import driver_url

    return sqlalchemy.create_engine(driver_url(url), isolation_level="AUTOCOMMIT", poolclass=sqlalchemy.pool.NullPool)


@pytest.fixture
def pg_url() -> Iterator[str]:
    """URL of a fresh database, dropped afterwards. Commits skip the fsync wait
    (``synchronous_commit=off``: a server crash could lose the last commits, which a
    throwaway test database does not mind) so that 2 busy CI cores keep up."""
    admin_url = os.environ.get(ENV)
    if not admin_url:
        pytest.skip(f"{ENV} is unset: .ci/run starts PostgreSQL (.ci/postgres.sh) and sets it")
    from sqlalchemy import text

    name = f"tuner_test_{uuid.uuid4().hex[:12]}"
    engine = _admin(admin_url)
    with engine.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
        conn.execute(text(f'ALTER DATABASE "{name}" SET synchronous_commit = off'))
    base, _, _db = admin_url.rpartition("/")
    try:
        yield f"{base}/{name}"
    finally:
        with engine.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        engine.dispose()
