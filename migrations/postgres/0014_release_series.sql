-- Continual release (issue 23): a series of `horizon` ticks of tree aggregation over the
-- DP popularity counts. Parameters are fixed when the series starts (JSON:
-- train::topn::continual::SeriesParams); `period` is the last tick committed.
CREATE TABLE release_series (
    id BIGSERIAL PRIMARY KEY,
    params TEXT NOT NULL,
    period BIGINT NOT NULL DEFAULT 0,
    created_at BIGINT NOT NULL
);

-- Who a series charged (admitted = 1, once, at `joined_period`) or left out for good
-- (admitted = 0: the user's filter could not take the series' charge).
CREATE TABLE series_members (
    series_id BIGINT NOT NULL,
    user_id TEXT NOT NULL,
    joined_period BIGINT NOT NULL,
    admitted BIGINT NOT NULL,
    PRIMARY KEY (series_id, user_id)
);

-- The arrival cap: the (user, item) pairs a series counts, with the tick that admitted
-- them. Never deleted: a deleted rating's pair stays counted (the tree's condition).
CREATE TABLE series_admitted (
    series_id BIGINT NOT NULL,
    user_id TEXT NOT NULL,
    item_id TEXT NOT NULL,
    rating_id BIGINT NOT NULL,
    period BIGINT NOT NULL,
    PRIMARY KEY (series_id, user_id, item_id)
);

-- A tree node's noise (JSON object item -> integer noise), drawn once and stored before
-- anything derived from it is published; every later estimate reuses it.
CREATE TABLE series_nodes (
    series_id BIGINT NOT NULL,
    level BIGINT NOT NULL,
    node_index BIGINT NOT NULL,
    noise TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    PRIMARY KEY (series_id, level, node_index)
);
