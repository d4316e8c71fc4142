-- One row per (release, user, charge): the ratings of one user that one release charged
-- the same amounts, listed as runs of consecutive rating ids ("4-9,12,15-20"). A release
-- writes a row per user and distinct charge instead of one per rating, so the ledger's
-- history grows with users x releases, not ratings x releases (issue 22: 20M charge rows
-- per release took 34 min at ML-20M size). `eps` is what the release added to EACH
-- listed rating's loss bound, `n` how many ratings are listed. Rows written before this
-- migration stay in `rating_charges` (one per rating); the audit reads both.
CREATE TABLE rating_charge_sets (
    release_id INTEGER NOT NULL,
    user_id TEXT NOT NULL,
    n INTEGER NOT NULL,
    eps_train REAL NOT NULL,
    eps_popularity REAL NOT NULL,
    rho REAL NOT NULL,
    eps REAL NOT NULL,
    unit TEXT NOT NULL,
    neighbour TEXT NOT NULL,
    rating_ids TEXT NOT NULL
);
CREATE INDEX rating_charge_sets_user_release ON rating_charge_sets (user_id, release_id);
CREATE INDEX rating_charge_sets_release ON rating_charge_sets (release_id);
