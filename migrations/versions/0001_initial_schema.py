"""initial schema

Revision ID: 0001
Revises: 
Create Date: 2026-11-22
"""
from alembic import op
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

revision = '0001'
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('policies',
    sa.Column('version', sa.Integer(), autoincrement=False, nullable=False),
    sa.Column('name', sa.String(length=128), nullable=False),
    sa.Column('parent_version', sa.Integer(), nullable=True),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('path', sa.Text(), nullable=True),
    sa.Column('base_model', sa.Text(), nullable=True),
    sa.Column('metrics', sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql'), nullable=True),
    sa.Column('evaluation', sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql'), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('activated_at', sa.DateTime(timezone=True), nullable=True),
    sa.PrimaryKeyConstraint('version', name=op.f('pk_policies')),
    sa.UniqueConstraint('name', name=op.f('uq_policies_name'))
    )
    with op.batch_alter_table('policies', schema=None) as batch_op:
        batch_op.create_index('uq_policies_one_active', ['status'], unique=True, postgresql_where=sa.text("status = 'active'"), sqlite_where=sa.text("status = 'active'"))

    op.create_table('train_steps',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('policy_version', sa.Integer(), nullable=True),
    sa.Column('rollout_count', sa.Integer(), nullable=False),
    sa.Column('transition_count', sa.Integer(), nullable=False),
    sa.Column('metrics', sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql'), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_train_steps'))
    )
    op.create_table('rollouts',
    sa.Column('id', sa.String(length=128), nullable=False),
    sa.Column('project', sa.String(length=128), nullable=True),
    sa.Column('task_id', sa.String(length=256), nullable=True),
    sa.Column('agent', sa.String(length=128), nullable=True),
    sa.Column('status', sa.String(length=16), server_default='open', nullable=False),
    sa.Column('reward', sa.Float(), nullable=True),
    sa.Column('metadata', sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql'), nullable=True),
    sa.Column('policy_version', sa.Integer(), nullable=True),
    sa.Column('call_count', sa.Integer(), server_default=sa.text('0'), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('finished_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('trained_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('train_step_id', sa.Integer(), nullable=True),
    sa.Column('lease_owner', sa.String(length=128), nullable=True),
    sa.Column('lease_expires_at', sa.DateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['train_step_id'], ['train_steps.id'], name=op.f('fk_rollouts_train_step_id_train_steps')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_rollouts'))
    )
    with op.batch_alter_table('rollouts', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_rollouts_task_id'), ['task_id'], unique=False)
        batch_op.create_index('ix_rollouts_trainable', ['finished_at'], unique=False, postgresql_where=sa.text("status = 'finished' AND trained_at IS NULL"), sqlite_where=sa.text("status = 'finished' AND trained_at IS NULL"))

    op.create_table('calls',
    sa.Column('id', sa.String(length=64), nullable=False),
    sa.Column('rollout_id', sa.String(length=128), nullable=True),
    sa.Column('seq', sa.Integer(), nullable=True),
    sa.Column('agent', sa.String(length=128), nullable=True),
    sa.Column('task_id', sa.String(length=256), nullable=True),
    sa.Column('project', sa.String(length=128), nullable=True),
    sa.Column('route', sa.String(length=32), nullable=False),
    sa.Column('model', sa.String(length=256), nullable=True),
    sa.Column('upstream_model', sa.String(length=256), nullable=True),
    sa.Column('policy_version', sa.Integer(), nullable=True),
    sa.Column('stream', sa.Boolean(), nullable=False),
    sa.Column('status', sa.String(length=32), nullable=False),
    sa.Column('http_status', sa.Integer(), nullable=True),
    sa.Column('upstream', sa.String(length=256), nullable=True),
    sa.Column('request', sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql'), nullable=True),
    sa.Column('response', sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql'), nullable=True),
    sa.Column('error', sa.Text(), nullable=True),
    sa.Column('prompt_token_ids', sa.JSON().with_variant(postgresql.ARRAY(sa.Integer()), 'postgresql'), nullable=True),
    sa.Column('prompt_tokens', sa.Integer(), nullable=True),
    sa.Column('completion_tokens', sa.Integer(), nullable=True),
    sa.Column('prefix_parent_id', sa.String(length=64), nullable=True),
    sa.Column('prefix_kind', sa.String(length=16), nullable=True),
    sa.Column('latency_ms', sa.Float(), nullable=True),
    sa.Column('ttft_ms', sa.Float(), nullable=True),
    sa.Column('started_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('finished_at', sa.DateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['rollout_id'], ['rollouts.id'], name=op.f('fk_calls_rollout_id_rollouts'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_calls')),
    sa.UniqueConstraint('rollout_id', 'seq', name='uq_calls_rollout_seq')
    )
    with op.batch_alter_table('calls', schema=None) as batch_op:
        batch_op.create_index('ix_calls_rollout_id', ['rollout_id'], unique=False)
        batch_op.create_index('ix_calls_started_at', ['started_at'], unique=False)

    op.create_table('call_choices',
    sa.Column('call_id', sa.String(length=64), nullable=False),
    sa.Column('index', sa.Integer(), nullable=False),
    sa.Column('token_ids', sa.JSON().with_variant(postgresql.ARRAY(sa.Integer()), 'postgresql'), nullable=True),
    sa.Column('logprobs', sa.JSON().with_variant(postgresql.ARRAY(sa.REAL()), 'postgresql'), nullable=True),
    sa.Column('finish_reason', sa.String(length=32), nullable=True),
    sa.ForeignKeyConstraint(['call_id'], ['calls.id'], name=op.f('fk_call_choices_call_id_calls'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('call_id', 'index', name=op.f('pk_call_choices'))
    )
    op.create_table('rewards',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('rollout_id', sa.String(length=128), nullable=False),
    sa.Column('call_id', sa.String(length=64), nullable=True),
    sa.Column('kind', sa.String(length=16), nullable=False),
    sa.Column('value', sa.Float(), nullable=False),
    sa.Column('reason', sa.String(length=128), nullable=True),
    sa.Column('metadata', sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql'), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['call_id'], ['calls.id'], name=op.f('fk_rewards_call_id_calls'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['rollout_id'], ['rollouts.id'], name=op.f('fk_rewards_rollout_id_rollouts'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_rewards'))
    )
    with op.batch_alter_table('rewards', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_rewards_rollout_id'), ['rollout_id'], unique=False)
        batch_op.create_index('uq_rewards_air', ['call_id', 'reason'], unique=True, postgresql_where=sa.text("kind = 'air'"), sqlite_where=sa.text("kind = 'air'"))



def downgrade() -> None:
    with op.batch_alter_table('rewards', schema=None) as batch_op:
        batch_op.drop_index('uq_rewards_air', postgresql_where=sa.text("kind = 'air'"), sqlite_where=sa.text("kind = 'air'"))
        batch_op.drop_index(batch_op.f('ix_rewards_rollout_id'))

    op.drop_table('rewards')
    op.drop_table('call_choices')
    with op.batch_alter_table('calls', schema=None) as batch_op:
        batch_op.drop_index('ix_calls_started_at')
        batch_op.drop_index('ix_calls_rollout_id')

    op.drop_table('calls')
    with op.batch_alter_table('rollouts', schema=None) as batch_op:
        batch_op.drop_index('ix_rollouts_trainable', postgresql_where=sa.text("status = 'finished' AND trained_at IS NULL"), sqlite_where=sa.text("status = 'finished' AND trained_at IS NULL"))
        batch_op.drop_index(batch_op.f('ix_rollouts_task_id'))

    op.drop_table('rollouts')
    op.drop_table('train_steps')
    with op.batch_alter_table('policies', schema=None) as batch_op:
        batch_op.drop_index('uq_policies_one_active', postgresql_where=sa.text("status = 'active'"), sqlite_where=sa.text("status = 'active'"))

    op.drop_table('policies')
