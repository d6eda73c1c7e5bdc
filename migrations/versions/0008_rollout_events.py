"""rollout events as rows

Agent events (`POST /rollouts/{id}/events`) were appended to the rollout's metadata, so each one rewrote the
whole metadata: the more a rollout held, the slower the next event (1 MiB events went from 0.05 to 2.4 s each).
Now each event is a row of `rollout_events`, written alone. Events already in a rollout's metadata stay there
and are read back before the rows (store/events.py), so nothing is moved here.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-26
"""
from alembic import op
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

revision = '0008'
down_revision = '0007'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'rollout_events',
        sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
        sa.Column('rollout_id', sa.String(length=128), nullable=False),
        sa.Column('event_type', sa.String(length=128), nullable=False),
        sa.Column('data', sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql'),
                  nullable=True),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(['rollout_id'], ['rollouts.id'], ondelete='CASCADE',
                                name=op.f('fk_rollout_events_rollout_id_rollouts')),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_rollout_events')),
    )
    op.create_index('ix_rollout_events_rollout_id', 'rollout_events', ['rollout_id', 'id'], unique=False)


def downgrade() -> None:
    op.drop_index('ix_rollout_events_rollout_id', table_name='rollout_events')
    op.drop_table('rollout_events')
