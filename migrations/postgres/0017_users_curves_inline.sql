-- A release rewrites every charged user's RDP curve (`rdp_consumed`: 156 orders as JSON,
-- about 3 kB). Above 2 kB a row is toasted by default: the curve compressed and moved to
-- the TOAST table, so each rewrite compressed it, wrote it there and left a dead copy, and
-- each read decompressed it. The rows stay in the table's own pages uncompressed up to
-- this target (the largest a page holds). Applies to rows written from now on.
ALTER TABLE users SET (toast_tuple_target = 8160);
