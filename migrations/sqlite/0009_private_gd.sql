-- Private-GD / GD-DR rounds (issue 9). One row per round; `state` is the published
-- round state (schedule, item ids, item profiles) as JSON. `rows`, `rank` and
-- `eps_round` are copied out so a report is validated without parsing the state.
CREATE TABLE ldp_rounds (
    id INTEGER PRIMARY KEY NOT NULL,
    status TEXT NOT NULL,
    state TEXT NOT NULL,
    report_rows INTEGER NOT NULL,
    report_rank INTEGER NOT NULL,
    eps_round REAL NOT NULL,
    n_reports INTEGER NOT NULL DEFAULT 0,
    created_at INTEGER NOT NULL,
    closed_at INTEGER
);

-- One report per (round, user): the coordinate and the bit, and the local eps charged
-- to the user's RDP ledger in the same transaction (unit user, LDP).
CREATE TABLE ldp_reports (
    round_id INTEGER NOT NULL,
    user_id TEXT NOT NULL,
    row_index INTEGER NOT NULL,
    col_index INTEGER NOT NULL,
    bit INTEGER NOT NULL,
    eps REAL NOT NULL,
    created_at INTEGER NOT NULL,
    PRIMARY KEY (round_id, user_id)
);
CREATE INDEX ldp_reports_user ON ldp_reports (user_id);
