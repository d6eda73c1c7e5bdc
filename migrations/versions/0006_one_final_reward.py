"""one final reward per rollout

Until now only the request handler kept a rollout to one final reward: it locked the rollout row with
`SELECT … FOR UPDATE`, which SQLite ignores, so concurrent final rewards could each close the same rollout
there and store several `final` rows with different values. Two partial unique indexes make it the
database's rule: one final reward the agent gave per rollout (`reason IS NULL`: `POST /reward`, an exported
span) and one per other giver (`reason`, e.g. the trainer's judge, whose score judge+posted keeps beside the
posted one). The handler now also closes a rollout with an `UPDATE … WHERE status = 'open'`, so a request that
lost the race answers 200 or 409 from what the winner stored instead of failing on the index.

Databases that already hold duplicates still migrate: per rollout and giver the row that agrees with
`rollouts.reward` (the value the rollout holds and the trainer reads; the earliest such row) is kept, or the
earliest row when none agrees, and the others are deleted. They are the requests that lost the race: with the
rule in place they would have been answered 409 and never stored. The count is logged.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-25
"""
import logging

from alembic import op
import sqlalchemy as sa

revision = '0006'
down_revision = '0005'
branch_labels = None
depends_on = None

AGENT_FINAL = "kind = 'final' AND reason IS NULL"
OTHER_FINAL = "kind = 'final' AND reason IS NOT NULL"

# Every final reward but one per (rollout, giver); the LEFT JOIN keeps rows whose rollout is gone out of it.
DUPLICATES = """
DELETE FROM rewards WHERE kind = 'final' AND id NOT IN (
    SELECT kept.id FROM (
        SELECT COALESCE(MIN(CASE WHEN r.value = o.reward THEN r.id END), MIN(r.id)) AS id
        FROM rewards r LEFT JOIN rollouts o ON o.id = r.rollout_id
        WHERE r.kind = 'final'
        GROUP BY r.rollout_id, COALESCE(r.reason, '')
    ) AS kept
)
"""


def upgrade() -> None:
    deleted = op.get_bind().execute(sa.text(DUPLICATES)).rowcount
    if deleted:
        logging.getLogger("alembic.runtime.migration").warning(
            "deleted %d duplicate final rewards (a rollout keeps the one matching rollouts.reward)", deleted)
    op.create_index('uq_rewards_final', 'rewards', ['rollout_id'], unique=True,
                    postgresql_where=sa.text(AGENT_FINAL), sqlite_where=sa.text(AGENT_FINAL))
    op.create_index('uq_rewards_final_by_reason', 'rewards', ['rollout_id', 'reason'], unique=True,
                    postgresql_where=sa.text(OTHER_FINAL), sqlite_where=sa.text(OTHER_FINAL))


def downgrade() -> None:
    op.drop_index('uq_rewards_final_by_reason', table_name='rewards')
    op.drop_index('uq_rewards_final', table_name='rewards')
