"""pruned rollouts

Retention deletes rollouts that are done with. A call of such a rollout could still wait in a proxy's spool (the
proxy was stopped, or could not reach the database, for longer than the retention age); stored then, it brought
the rollout back as a new, open one numbered from 1 again. Each rollout deleted now leaves its id here
(store/retention.py), and the writer sets such late calls aside instead (store/calls.py).

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-27
"""
from alembic import op
import sqlalchemy as sa

revision = '0012'
down_revision = '0011'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'pruned_rollouts',
        sa.Column('id', sa.String(length=128), nullable=False),
        sa.Column('pruned_at', sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_pruned_rollouts')),
    )


def downgrade() -> None:
    op.drop_table('pruned_rollouts')
