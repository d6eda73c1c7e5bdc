"""named policies

Several policies at once (one per agent role or project, chosen by the proxy's routing rules): a version
belongs to a named policy (`policies.policy`), each policy has its own active version, and each call records
which policy answered it (`calls.policy`). Everything before this belongs to the policy `default`; the column
defaults make that true without rewriting either table (a constant default is instant on Postgres 11+).

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-24
"""
from alembic import op
import sqlalchemy as sa

revision = '0005'
down_revision = '0004'
branch_labels = None
depends_on = None

ACTIVE = "status = 'active'"


def upgrade() -> None:
    with op.batch_alter_table('policies') as batch:
        batch.add_column(sa.Column('policy', sa.String(length=128), server_default='default', nullable=False))
    op.drop_index('uq_policies_one_active', table_name='policies')
    op.create_index('uq_policies_one_active', 'policies', ['policy'], unique=True,
                    postgresql_where=sa.text(ACTIVE), sqlite_where=sa.text(ACTIVE))
    with op.batch_alter_table('calls') as batch:
        batch.add_column(sa.Column('policy', sa.String(length=128), server_default='default', nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('calls') as batch:
        batch.drop_column('policy')
    op.drop_index('uq_policies_one_active', table_name='policies')
    op.create_index('uq_policies_one_active', 'policies', ['status'], unique=True,
                    postgresql_where=sa.text(ACTIVE), sqlite_where=sa.text(ACTIVE))
    with op.batch_alter_table('policies') as batch:
        batch.drop_column('policy')
