-- Scoped keys (issue 8 finding 5, DESIGN 6): a `user` token is bound to one user id
-- (NULL for the roles admin, writer, reader and public).
ALTER TABLE api_keys ADD COLUMN user_id TEXT;
CREATE INDEX api_keys_user ON api_keys (user_id);
