"""open rollouts index

Rollouts with no final reward within the trainer's `reward_ttl_s` are marked `expired` (a new value of
`rollouts.status`, a plain string column). The trainer looks for them oldest first; this partial index holds only
open rollouts, so the look stays cheap however many finished ones the table has.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-24
"""
from alembic import op
import sqlalchemy as sa

revision = '0004'
down_revision = '0003'
branch_labels = None
depends_on = None

OPEN = "status = 'open'"


def upgrade() -> None:
    op.create_index('ix_rollouts_open', 'rollouts', ['created_at'], unique=False,
                    postgresql_where=sa.text(OPEN), sqlite_where=sa.text(OPEN))


def downgrade() -> None:
    op.drop_index('ix_rollouts_open', table_name='rollouts')
