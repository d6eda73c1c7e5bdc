"""rollout step attempts

A step over several ranks that fails (one rank raises, runs out of memory or dies) stops every rank, and the
restarted trainer claimed the same rollouts again: a batch that fails every time stopped training for good. The
trainer now counts the steps begun on a rollout (`step_attempts`, before the step) and keeps the last failure it
saw (`step_error`); a batch whose steps did not finish twice is set aside with that error (trainer/worker.py).

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-02
"""
from alembic import op
import sqlalchemy as sa

revision = '0014'
down_revision = '0013'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column('rollouts', sa.Column('step_attempts', sa.Integer(), nullable=False, server_default='0'))
    op.add_column('rollouts', sa.Column('step_error', sa.Text(), nullable=True))


def downgrade() -> None:
    op.drop_column('rollouts', 'step_error')
    op.drop_column('rollouts', 'step_attempts')
