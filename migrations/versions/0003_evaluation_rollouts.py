"""evaluation rollouts

`rollouts.eval`: a rollout marked as evaluation (`POST /rollouts {"eval": true}`, the `X-Rlproxy-Eval` header
on its calls, or an agent named in `rlproxy train --eval-agents`) is served like any other and never trained
on; `GET /policies` reports its final rewards per policy version. The trainer's partial index leaves such
rollouts out (they are never marked trained, so they would otherwise stay in it for good), and a small
partial index finds them by version.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-29
"""
from alembic import op
import sqlalchemy as sa

revision = '0003'
down_revision = '0002'
branch_labels = None
depends_on = None

OLD_TRAINABLE = "status = 'finished' AND trained_at IS NULL"
TRAINABLE = "status = 'finished' AND trained_at IS NULL AND NOT eval"
EVALUATED = "eval AND status = 'finished'"


def upgrade() -> None:
    op.add_column('rollouts', sa.Column('eval', sa.Boolean(), server_default=sa.text('false'), nullable=False))
    op.drop_index('ix_rollouts_trainable', table_name='rollouts')
    op.create_index('ix_rollouts_trainable', 'rollouts', ['finished_at'], unique=False,
                    postgresql_where=sa.text(TRAINABLE), sqlite_where=sa.text(TRAINABLE))
    op.create_index('ix_rollouts_eval', 'rollouts', ['policy_version'], unique=False,
                    postgresql_where=sa.text(EVALUATED), sqlite_where=sa.text(EVALUATED))


def downgrade() -> None:
    op.drop_index('ix_rollouts_eval', table_name='rollouts')
    op.drop_index('ix_rollouts_trainable', table_name='rollouts')
    with op.batch_alter_table('rollouts', schema=None) as batch_op:  # SQLite: the table is copied without it
        batch_op.drop_column('eval')
    op.create_index('ix_rollouts_trainable', 'rollouts', ['finished_at'], unique=False,
                    postgresql_where=sa.text(OLD_TRAINABLE), sqlite_where=sa.text(OLD_TRAINABLE))
