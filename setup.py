"""Package layout that pyproject.toml cannot express: the wheel holds only ``walkeep``.

The repository keeps Alembic's scripts in the top-level ``migrations/`` folder (so
``alembic upgrade head`` runs from a checkout); the wheel ships that same folder as
``walkeep._migrations``, which ``walkeep.db.migrate`` locates. Nothing is installed
under a generic top-level name (``worker``/``migrations`` would collide with other
projects in site-packages). Everything else lives in pyproject.toml.
"""

from setuptools import find_namespace_packages, setup

setup(
    packages=[
        *find_namespace_packages(include=["walkeep", "walkeep.*"], exclude=["*.__pycache__"]),
        "walkeep._migrations",
        "walkeep._migrations.versions",
    ],
    package_dir={
        "walkeep._migrations": "migrations",
        "walkeep._migrations.versions": "migrations/versions",
    },
)
