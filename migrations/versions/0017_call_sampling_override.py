"""calls.sampling_override: what `rlproxy serve --rollout-sampling` changed in a call's request

With `--rollout-sampling`, a training rollout's call goes upstream with the operator's temperature, top_p or
top_k instead of the agent's (a greedy agent's attempts would all be the same). `request` keeps what the agent
sent and `sampling` what the engine sampled with; this column says what was changed: `{"rule": the setting's
text, "asked": {field: the agent's value, null when absent}, "sent": {field: the value sent}}`. NULL: the call
went upstream with the agent's own sampling, as every call recorded before this migration did, so no stored call
changes its meaning.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-02
"""
from alembic import op
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

revision = '0017'
down_revision = '0016'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column('calls', sa.Column(
        'sampling_override', sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql'), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('calls') as batch:  # SQLite rebuilds the table to drop a column
        batch.drop_column('sampling_override')
