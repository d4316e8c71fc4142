-- The public time from which a release is visible (served, listed, in /readyz): its job's
-- start plus `release.publish_delay_secs`, or the next multiple of that delay when the
-- commit ends later (`release::public_deadline`). Written with the model; a release
-- without a model is never visible. Releases committed before this column: visible.
ALTER TABLE releases ADD COLUMN visible_at BIGINT NOT NULL DEFAULT 0;
