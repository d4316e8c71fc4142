-- A continual tick reads only what it has not offered yet (issue 23, steady ticks at scale):
-- `offered_id` is the largest rating id the series' last tick offered to its arrival cap
-- (every rating at or below it was visible to that tick), `offered_at` the time of that
-- tick's read (ratings updated since, e.g. re-rated after a deletion, are offered again).
-- 0 for a series that has not ticked: its first tick reads every rating.
ALTER TABLE release_series ADD COLUMN offered_id BIGINT NOT NULL DEFAULT 0;
ALTER TABLE release_series ADD COLUMN offered_at BIGINT NOT NULL DEFAULT 0;

-- Per-item counts of a series' admitted pairs, grouped without touching the pairs' users.
CREATE INDEX series_admitted_items ON series_admitted (series_id, item_id);
