-- dprec schema, SQLite flavour. Timestamps are Unix milliseconds (BIGINT).
CREATE TABLE users (
    id TEXT PRIMARY KEY NOT NULL,
    default_eps REAL,
    budget_eps REAL NOT NULL,
    budget_delta REAL NOT NULL,
    rdp_consumed TEXT NOT NULL,
    deleted INTEGER NOT NULL DEFAULT 0,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL
);

CREATE TABLE items (
    id TEXT PRIMARY KEY NOT NULL,
    created_at INTEGER NOT NULL
);

-- value NULL: the rating was deleted (raw data gone); its budget slot stays.
CREATE TABLE ratings (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    user_id TEXT NOT NULL,
    item_id TEXT NOT NULL,
    value REAL,
    eps REAL NOT NULL,
    spent REAL NOT NULL DEFAULT 0,
    releases INTEGER NOT NULL DEFAULT 0,
    origin TEXT NOT NULL DEFAULT 'raw',
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL,
    UNIQUE (user_id, item_id)
);
CREATE INDEX ratings_updated ON ratings (updated_at);

CREATE TABLE releases (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    trainer TEXT NOT NULL,
    params TEXT NOT NULL,
    guarantee TEXT NOT NULL,
    mechanisms TEXT NOT NULL,
    popularity_eps REAL NOT NULL,
    n_ratings INTEGER NOT NULL,
    n_users INTEGER NOT NULL,
    n_items INTEGER NOT NULL,
    job_id INTEGER,
    created_at INTEGER NOT NULL
);

-- One row per (release, rating): what the release spent of the rating's eps_ij.
CREATE TABLE rating_charges (
    release_id INTEGER NOT NULL,
    rating_id INTEGER NOT NULL,
    user_id TEXT NOT NULL,
    item_id TEXT NOT NULL,
    eps_train REAL NOT NULL,
    eps_popularity REAL NOT NULL,
    eps REAL NOT NULL,
    unit TEXT NOT NULL,
    neighbour TEXT NOT NULL,
    PRIMARY KEY (release_id, rating_id)
);
CREATE INDEX rating_charges_rating ON rating_charges (rating_id);
CREATE INDEX rating_charges_user ON rating_charges (user_id);

-- One row per (release, user): the RDP events charged to the user's filter.
CREATE TABLE user_charges (
    release_id INTEGER NOT NULL,
    user_id TEXT NOT NULL,
    events TEXT NOT NULL,
    unit TEXT NOT NULL,
    neighbour TEXT NOT NULL,
    admitted_order REAL NOT NULL,
    PRIMARY KEY (release_id, user_id)
);
CREATE INDEX user_charges_user ON user_charges (user_id);

CREATE TABLE models (
    release_id INTEGER PRIMARY KEY NOT NULL,
    model TEXT NOT NULL,
    users TEXT NOT NULL,
    items TEXT NOT NULL,
    popularity TEXT NOT NULL
);

CREATE TABLE jobs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    kind TEXT NOT NULL,
    status TEXT NOT NULL,
    reason TEXT,
    release_id INTEGER,
    created_at INTEGER NOT NULL,
    finished_at INTEGER
);

CREATE TABLE leases (
    name TEXT PRIMARY KEY NOT NULL,
    holder TEXT NOT NULL,
    expires_at INTEGER NOT NULL
);

CREATE TABLE api_keys (
    key_hash TEXT PRIMARY KEY NOT NULL,
    role TEXT NOT NULL,
    created_at INTEGER NOT NULL
);
