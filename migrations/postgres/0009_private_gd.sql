-- Private-GD / GD-DR rounds (issue 9). One row per round; `state` is the published
-- round state (schedule, item ids, item profiles) as JSON. `rows`, `rank` and
-- `eps_round` are copied out so a report is validated without parsing the state.
CREATE TABLE ldp_rounds (
    id BIGINT PRIMARY KEY NOT NULL,
    status TEXT NOT NULL,
    state TEXT NOT NULL,
    report_rows BIGINT NOT NULL,
    report_rank BIGINT NOT NULL,
    eps_round DOUBLE PRECISION NOT NULL,
    n_reports BIGINT NOT NULL DEFAULT 0,
    created_at BIGINT NOT NULL,
    closed_at BIGINT
);

-- One report per (round, user): the coordinate and the bit, and the local eps charged
-- to the user's RDP ledger in the same transaction (unit user, LDP).
CREATE TABLE ldp_reports (
    round_id BIGINT NOT NULL,
    user_id TEXT NOT NULL,
    row_index BIGINT NOT NULL,
    col_index BIGINT NOT NULL,
    bit BIGINT NOT NULL,
    eps DOUBLE PRECISION NOT NULL,
    created_at BIGINT NOT NULL,
    PRIMARY KEY (round_id, user_id)
);
CREATE INDEX ldp_reports_user ON ldp_reports (user_id);
