-- Rating spends written lazily (issue 22, `store::pending`): a rating's row holds the
-- charge sets of its user's releases up to the user's `release_id` here (none: 0); the
-- sets of later releases are pending and folded in by every reader. A table of its own,
-- not a column of `users`: a commit writes it under its locks on ratings rows, and
-- ingestion locks a user's row before the user's ratings (PostgreSQL lock order).
-- Every set stored before this migration was written together with its ratings' rows,
-- so every user is settled through the last release.
CREATE TABLE rating_settlements (
    user_id TEXT PRIMARY KEY NOT NULL,
    release_id BIGINT NOT NULL
);
INSERT INTO rating_settlements (user_id, release_id)
    SELECT id, (SELECT COALESCE(MAX(id), 0) FROM releases) FROM users;
-- How many ledger transactions have charged ratings: the training snapshot reads it, and a
-- commit that finds it moved by no other release re-checks its charges against the states
-- the release was planned from instead of reading every charged rating's row again.
CREATE TABLE ledger_clock (
    id INTEGER PRIMARY KEY NOT NULL,
    n BIGINT NOT NULL
);
INSERT INTO ledger_clock (id, n) VALUES (1, 0);
