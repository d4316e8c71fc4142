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
