"""policy replicas

Which engine replicas serve each policy version (engine/fleet.py): `verified` once a replica loaded the
version's adapter and answered the probe as the others do, `withheld` (with the reason) when it could not, which
keeps the proxies from routing that version's calls to it until a retry verifies it. A row per (version,
replica) rather than a field of the policy row, because the trainer, the gates and every proxy write these
at once and each write must stand alone. No rows exist for earlier versions: a replica without a row is in
rotation, as before.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-27
"""
from alembic import op
import sqlalchemy as sa

revision = '0007'
down_revision = '0006'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'policy_replicas',
        sa.Column('version', sa.Integer(), nullable=False),
        sa.Column('replica', sa.String(length=512), nullable=False),
        sa.Column('state', sa.String(length=16), nullable=False),
        sa.Column('digest', sa.String(length=80), nullable=True),
        sa.Column('reason', sa.Text(), nullable=True),
        sa.Column('failures', sa.Integer(), server_default=sa.text('0'), nullable=False),
        sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(['version'], ['policies.version'], ondelete='CASCADE',
                                name=op.f('fk_policy_replicas_version_policies')),
        sa.PrimaryKeyConstraint('version', 'replica', name=op.f('pk_policy_replicas')),
    )


def downgrade() -> None:
    op.drop_table('policy_replicas')
