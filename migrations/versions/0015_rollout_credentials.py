"""rollout credentials

Every agent of a project held the same key, and that key could reward any rollout of the project, evaluation
rollouts included. Now each rollout `POST /rollouts` creates has a token of its own for its agent, good for that
rollout alone (`token_hash`), and a rollout whose reward its creator's program gives (`reward_source` 'grader',
or 'judge') a second, the grader token, for that program (`grader_token_hash`); only SHA-256 digests are
stored. Who gave a final reward is kept (`rewarded_by`): evaluation figures count only the rollouts that an
evaluation credential rewarded. A reward anyone else posts to such a rollout is kept as a reward of kind
'claim' (the kind column is text: no change needed), never trained on. Keys made for evaluation have
`api_keys.eval`.

Rollouts from before this migration have no tokens, their source is the agent, and nobody is known to have
rewarded them: their evaluation rewards leave the figures, since any key of their project may have written them.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-02
"""
from alembic import op
import sqlalchemy as sa

revision = '0015'
down_revision = '0014'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column('rollouts', sa.Column('token_hash', sa.String(length=64), nullable=True))
    op.add_column('rollouts', sa.Column('grader_token_hash', sa.String(length=64), nullable=True))
    op.add_column('rollouts', sa.Column('reward_source', sa.String(length=16), nullable=True))
    op.add_column('rollouts', sa.Column('rewarded_by', sa.String(length=16), nullable=True))
    op.create_index(op.f('ix_rollouts_token_hash'), 'rollouts', ['token_hash'], unique=True)
    op.create_index(op.f('ix_rollouts_grader_token_hash'), 'rollouts', ['grader_token_hash'], unique=True)
    op.add_column('api_keys', sa.Column('eval', sa.Boolean(), nullable=False, server_default=sa.text('false')))


def downgrade() -> None:
    op.drop_column('api_keys', 'eval')
    op.drop_index(op.f('ix_rollouts_grader_token_hash'), table_name='rollouts')
    op.drop_index(op.f('ix_rollouts_token_hash'), table_name='rollouts')
    op.drop_column('rollouts', 'rewarded_by')
    op.drop_column('rollouts', 'reward_source')
    op.drop_column('rollouts', 'grader_token_hash')
    op.drop_column('rollouts', 'token_hash')
