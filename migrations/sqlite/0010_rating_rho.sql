-- The Gaussian part of a rating's privacy loss, composed in zCDP (issue 8, rating
-- level): a rating's loss bound at delta_r is `spent + eps(rho)` (ledger::rating_loss).
-- `rating_charges.rho` is what one release added.
ALTER TABLE ratings ADD COLUMN rho REAL NOT NULL DEFAULT 0;
ALTER TABLE rating_charges ADD COLUMN rho REAL NOT NULL DEFAULT 0;
