-- While a release is in flight (from before its snapshot until its commit ends), the
-- user-level events it will charge every user it admits (`store::holds`). A budget
-- change, an LDP rating and a Private-GD report are admitted only if the user's filter
-- still admits the held events afterwards, so none of them can make the release's commit
-- fail. One row; `holder` is the trainer lease holder ('' when no release is in flight),
-- and a hold counts only while that holder's trainer lease is live.
CREATE TABLE release_holds (
    id INTEGER PRIMARY KEY NOT NULL,
    holder TEXT NOT NULL,
    events TEXT NOT NULL
);
INSERT INTO release_holds (id, holder, events) VALUES (1, '', '[]');
