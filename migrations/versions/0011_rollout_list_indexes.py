"""rollout list indexes

The web view lists rollouts newest or oldest first, or by reward (a rollout without one as the lowest), a keyset
page at a time, for the operator (all projects, or one) and for a project key (its own project and none). No index
held those orders (the only `created_at` index is partial, open rollouts only) and none held `project`, so every
page sorted the whole table. These indexes hold each order the list reads (store/browse.py ORDERINGS), the sort key
then the id, with the project first for a project's pages; the reward order is the very expression the query sorts
by, `coalesce(reward, CAST('-1e+308' AS FLOAT))`, spelled as Postgres gives it back. The task view reads one
task's newest attempts: (task_id, created_at, id).

Building them locks the rollouts table against writes for as long as it takes (seconds per million rows): calls
recorded meanwhile wait in the proxy's spool, as in any database outage.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-27
"""
from alembic import op
import sqlalchemy as sa

revision = '0011'
down_revision = '0010'
branch_labels = None
depends_on = None

# store/browse.py REWARD_KEY: the same expression, or the planner cannot match it (SQLite: the same text)
REWARD_KEY = "coalesce(reward, CAST('-1e+308' AS FLOAT))"


def upgrade() -> None:
    op.create_index('ix_rollouts_created', 'rollouts', ['created_at', 'id'], unique=False)
    op.create_index('ix_rollouts_reward', 'rollouts', [sa.text(REWARD_KEY), 'id'], unique=False)
    op.create_index('ix_rollouts_project_created', 'rollouts', ['project', 'created_at', 'id'], unique=False)
    op.create_index('ix_rollouts_project_reward', 'rollouts', ['project', sa.text(REWARD_KEY), 'id'], unique=False)
    op.create_index('ix_rollouts_task_created', 'rollouts', ['task_id', 'created_at', 'id'], unique=False)


def downgrade() -> None:
    for name in ('ix_rollouts_task_created', 'ix_rollouts_project_reward', 'ix_rollouts_project_created',
                 'ix_rollouts_reward', 'ix_rollouts_created'):
        op.drop_index(name, table_name='rollouts')
