-- dprec schema, PostgreSQL flavour. Timestamps are Unix milliseconds (BIGINT).
CREATE TABLE users (
    id TEXT PRIMARY KEY NOT NULL,
    default_eps DOUBLE PRECISION,
    budget_eps DOUBLE PRECISION NOT NULL,
    budget_delta DOUBLE PRECISION NOT NULL,
    rdp_consumed TEXT NOT NULL,
    deleted BIGINT NOT NULL DEFAULT 0,
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL
);

CREATE TABLE items (
    id TEXT PRIMARY KEY NOT NULL,
    created_at BIGINT NOT NULL
);

-- value NULL: the rating was deleted (raw data gone); its budget slot stays.
CREATE TABLE ratings (
    id BIGSERIAL PRIMARY KEY,
    user_id TEXT NOT NULL,
    item_id TEXT NOT NULL,
    value DOUBLE PRECISION,
    eps DOUBLE PRECISION NOT NULL,
    spent DOUBLE PRECISION NOT NULL DEFAULT 0,
    releases BIGINT NOT NULL DEFAULT 0,
    origin TEXT NOT NULL DEFAULT 'raw',
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL,
    UNIQUE (user_id, item_id)
);
CREATE INDEX ratings_updated ON ratings (updated_at);

CREATE TABLE releases (
    id BIGSERIAL PRIMARY KEY,
    trainer TEXT NOT NULL,
    params TEXT NOT NULL,
    guarantee TEXT NOT NULL,
    mechanisms TEXT NOT NULL,
    popularity_eps DOUBLE PRECISION NOT NULL,
    n_ratings BIGINT NOT NULL,
    n_users BIGINT NOT NULL,
    n_items BIGINT NOT NULL,
    job_id BIGINT,
    created_at BIGINT NOT NULL
);

-- One row per (release, rating): what the release spent of the rating's eps_ij.
CREATE TABLE rating_charges (
    release_id BIGINT NOT NULL,
    rating_id BIGINT NOT NULL,
    user_id TEXT NOT NULL,
    item_id TEXT NOT NULL,
    eps_train DOUBLE PRECISION NOT NULL,
    eps_popularity DOUBLE PRECISION NOT NULL,
    eps DOUBLE PRECISION NOT NULL,
    unit TEXT NOT NULL,
    neighbour TEXT NOT NULL,
    PRIMARY KEY (release_id, rating_id)
);
CREATE INDEX rating_charges_rating ON rating_charges (rating_id);
CREATE INDEX rating_charges_user ON rating_charges (user_id);

-- One row per (release, user): the RDP events charged to the user's filter.
CREATE TABLE user_charges (
    release_id BIGINT NOT NULL,
    user_id TEXT NOT NULL,
    events TEXT NOT NULL,
    unit TEXT NOT NULL,
    neighbour TEXT NOT NULL,
    admitted_order DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (release_id, user_id)
);
CREATE INDEX user_charges_user ON user_charges (user_id);

CREATE TABLE models (
    release_id BIGINT PRIMARY KEY NOT NULL,
    model TEXT NOT NULL,
    users TEXT NOT NULL,
    items TEXT NOT NULL,
    popularity TEXT NOT NULL
);

CREATE TABLE jobs (
    id BIGSERIAL PRIMARY KEY,
    kind TEXT NOT NULL,
    status TEXT NOT NULL,
    reason TEXT,
    release_id BIGINT,
    created_at BIGINT NOT NULL,
    finished_at BIGINT
);

CREATE TABLE leases (
    name TEXT PRIMARY KEY NOT NULL,
    holder TEXT NOT NULL,
    expires_at BIGINT NOT NULL
);

CREATE TABLE api_keys (
    key_hash TEXT PRIMARY KEY NOT NULL,
    role TEXT NOT NULL,
    created_at BIGINT NOT NULL
);
