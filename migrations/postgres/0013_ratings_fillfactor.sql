-- A release rewrites every charged rating's spend (`spent`, `rho`, `releases`: columns no
-- index covers). With full pages PostgreSQL writes each new row version to another page
-- and adds an entry to each of the table's three indexes; with half-empty pages the new
-- version stays on its page without index writes (a heap-only tuple), and the next
-- release's page pruning reuses the space. The cost is a table about twice as large.
-- Applies to pages written from now on (a `VACUUM FULL ratings` rewrites older ones).
ALTER TABLE ratings SET (fillfactor = 50);
