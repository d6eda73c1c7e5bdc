"""policy weights kept

The trainer removes the folders of versions nothing needs any more (the active version of each policy, its
parent, candidates under evaluation and the newest `keep_versions` stay: trainer/retention.py). A version whose
folder is gone keeps its row (its metrics, its rollouts' history) with `weights_kept` false, so `GET /policies`
says which versions can still be activated, and activating one that cannot is refused.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-02
"""
from alembic import op
import sqlalchemy as sa

revision = '0013'
down_revision = '0012'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column('policies', sa.Column('weights_kept', sa.Boolean(), nullable=False, server_default=sa.true()))


def downgrade() -> None:
    op.drop_column('policies', 'weights_kept')
