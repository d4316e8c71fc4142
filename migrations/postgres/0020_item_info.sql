-- Public item information (DESIGN 6): a title and categorical labels per catalogue item,
-- public like the id. `labels` is a JSON array of strings ('[]' for none), kept in the
-- item's row rather than a side table: labels are always read whole with their item (a
-- page of the catalogue, or every item when a model is loaded), never searched by label,
-- so one row per item needs no join and one multi-row upsert writes a batch.
ALTER TABLE items ADD COLUMN title TEXT;
ALTER TABLE items ADD COLUMN labels TEXT NOT NULL DEFAULT '[]';
