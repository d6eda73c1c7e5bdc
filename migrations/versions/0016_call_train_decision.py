"""calls.train_decision and calls.logprobs_mode: what the trainer did with each call, and what its log-probs are

A call the trainer skipped was counted in one step's metrics and nowhere else: nobody could tell, looking at a
rollout, which of its calls were trained. `train_decision` is written when a step consumes the call's rollout:
'trained', or the reason it was not (the reason names the trainer's step metrics use: 'sampling_altered',
'too_long', 'no_logprobs', ...). NULL: not decided yet (and every call of a rollout trained before this
migration: what happened to it is not known, so nothing is made up).

The engines now run with `--logprobs-mode processed_logprobs`: the log-probs a call records are those its tokens
were sampled with (after temperature and top-k/top-p), no longer the raw log-softmax. `logprobs_mode` says which a
call holds: 'processed' or 'raw'. NULL is a call recorded before this migration, whose engine ran vLLM's default:
raw. The trainer reads NULL as 'raw', so no stored call changes its meaning.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-02
"""
from alembic import op
import sqlalchemy as sa

revision = '0016'
down_revision = '0015'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column('calls', sa.Column('train_decision', sa.String(length=64), nullable=True))
    op.add_column('calls', sa.Column('logprobs_mode', sa.String(length=16), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('calls') as batch:  # SQLite rebuilds the table to drop a column
        batch.drop_column('logprobs_mode')
        batch.drop_column('train_decision')
