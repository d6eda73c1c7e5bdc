"""calls.sampling: what made a call's sampling differ from its recorded log-probs

The engine records raw log-probs (before temperature, top-p/top-k, penalties, grammar masks). A call sampled
with any of those was trained as if its tokens had been drawn from the raw distribution. The proxy now marks such
a call with the first field that changed its sampling (proxy/capture.py) and the trainer skips it. Calls stored
before stay unmarked: what they were sent with is in their `request`, in each wire format's own terms.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-27
"""
from alembic import op
import sqlalchemy as sa

revision = '0010'
down_revision = '0009'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column('calls', sa.Column('sampling', sa.String(length=64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('calls') as batch:  # SQLite rebuilds the table to drop a column
        batch.drop_column('sampling')
