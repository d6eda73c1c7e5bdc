"""policy verdicts

What the gates and `rlproxy eval` measured and decided about a version (store/verdicts.py) moves out of the
policy row's `evaluation` JSON, where three writers read, changed and wrote back one document, into typed rows
that are only added: `canary`, `command_gate`, `command_eval` (one row per split) and `heldout`. Existing
records are carried over, one row each; what else `evaluation` holds (the fleet's reference answer) stays
there. The downgrade writes each version's newest verdicts back into its `evaluation`.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-26
"""
from datetime import datetime, timezone

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

from store.verdicts import as_evaluation  # the one reading of verdict rows back into `evaluation` (downgrade)

revision = '0009'
down_revision = '0008'
branch_labels = None
depends_on = None

Document = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql')
Timestamp = sa.DateTime(timezone=True)

policies = sa.table('policies', sa.column('version', sa.Integer), sa.column('evaluation', Document))
verdicts = sa.table(
    'policy_verdicts', sa.column('id', sa.Integer), sa.column('version', sa.Integer),
    sa.column('kind', sa.String), sa.column('split', sa.String), sa.column('measured', sa.String),
    sa.column('score', sa.Float), sa.column('parent_version', sa.Integer), sa.column('parent_score', sa.Float),
    sa.column('promoted', sa.Boolean), sa.column('evidence', Document), sa.column('created_at', Timestamp))

# For each kind: the record's field → the typed column it moves to; every other field stays in `evidence`.
TYPED = {
    'canary': {'parent': 'parent_version', 'mean_reward': 'score', 'active_mean_reward': 'parent_score',
               'promoted': 'promoted'},
    'command_gate': {'split': 'split', 'digest': 'measured', 'score': 'score', 'parent': 'parent_version',
                     'parent_score': 'parent_score', 'promoted': 'promoted', 'when': 'created_at'},
    'command_eval': {'score': 'score', 'digest': 'measured', 'when': 'created_at'},
    'heldout': {'heldout_success': 'score', 'heldout_task_set': 'measured', 'when': 'created_at'},
}


def upgrade() -> None:
    op.create_table(
        'policy_verdicts',
        sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
        sa.Column('version', sa.Integer(), nullable=False),
        sa.Column('kind', sa.String(length=32), nullable=False),
        sa.Column('split', sa.String(length=32), nullable=True),
        sa.Column('measured', sa.String(length=80), nullable=True),
        sa.Column('score', sa.Float(), nullable=True),
        sa.Column('parent_version', sa.Integer(), nullable=True),
        sa.Column('parent_score', sa.Float(), nullable=True),
        sa.Column('promoted', sa.Boolean(), nullable=True),
        sa.Column('evidence', Document, nullable=True),
        sa.Column('created_at', Timestamp, nullable=False),
        sa.ForeignKeyConstraint(['version'], ['policies.version'], ondelete='CASCADE',
                                name=op.f('fk_policy_verdicts_version_policies')),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_policy_verdicts')),
    )
    op.create_index('ix_policy_verdicts_version_kind', 'policy_verdicts', ['version', 'kind'])
    op.create_index('ix_policy_verdicts_parent_version', 'policy_verdicts', ['parent_version'])

    bind = op.get_bind()
    rows = bind.execute(sa.select(policies.c.version, policies.c.evaluation)
                        .where(policies.c.evaluation.is_not(None)).order_by(policies.c.version)).all()
    for version, evaluation in rows:
        moved, kept = _split(version, dict(evaluation or {}))
        if moved:
            bind.execute(verdicts.insert(), moved)
            bind.execute(policies.update().where(policies.c.version == version).values(evaluation=kept or None))


def _split(version: int, evaluation: dict) -> tuple[list[dict], dict]:
    """A version's `evaluation` → its verdict rows and what stays in `evaluation`."""
    moved = []
    if isinstance(evaluation.get('canary'), dict):
        record = evaluation.pop('canary')
        moved.append(_row(version, 'canary', record, record.get('ended_at') or record.get('started_at')))
    if isinstance(evaluation.get('command_gate'), dict):
        record = evaluation.pop('command_gate')
        moved.append(_row(version, 'command_gate', record, record.get('when')))
    if isinstance(evaluation.get('command_eval'), dict):
        for split, record in evaluation.pop('command_eval').items():
            moved.append({**_row(version, 'command_eval', record, record.get('when')), 'split': split})
    if 'heldout_success' in evaluation:
        fields = [key for key in evaluation if key.startswith('heldout_') or key == 'when']
        record = {key: evaluation.pop(key) for key in fields}
        moved.append(_row(version, 'heldout', record, record.get('when')))
    return moved, evaluation


def _row(version: int, kind: str, record: dict, when: str | None) -> dict:
    typed = TYPED[kind]
    row = {column: None for column in ('split', 'measured', 'score', 'parent_version', 'parent_score', 'promoted')}
    row.update({column: record.get(field) for field, column in typed.items() if column != 'created_at'})
    evidence = {field: value for field, value in record.items() if field not in typed}
    return {**row, 'version': version, 'kind': kind, 'evidence': evidence or None, 'created_at': _moment(when)}


def _moment(when: str | None) -> datetime:
    try:
        moment = datetime.fromisoformat(when)
    except (TypeError, ValueError):
        return datetime.now(timezone.utc)  # a record without a readable time: now, the carry-over's
    return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)


def downgrade() -> None:
    bind = op.get_bind()
    by_version: dict[int, list] = {}
    for row in bind.execute(sa.select(verdicts).order_by(verdicts.c.id)).all():
        by_version.setdefault(row.version, []).append(row)
    for version, rows in by_version.items():
        kept = bind.execute(sa.select(policies.c.evaluation).where(policies.c.version == version)).scalar()
        bind.execute(policies.update().where(policies.c.version == version)
                     .values(evaluation={**(kept or {}), **as_evaluation(rows)}))
    op.drop_index('ix_policy_verdicts_parent_version', table_name='policy_verdicts')
    op.drop_index('ix_policy_verdicts_version_kind', table_name='policy_verdicts')
    op.drop_table('policy_verdicts')
