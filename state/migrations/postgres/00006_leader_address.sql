-- Where the leader's API answers (issue 41 §2): a standby forwards the writes it is sent
-- (the CLI's, routers' load reports and wakes) there. Written with each renewal.
-- SQLite's is a Go migration (migrate.go: a file may have the column already).

-- +goose Up
ALTER TABLE leader ADD COLUMN IF NOT EXISTS address TEXT NOT NULL DEFAULT '';

-- +goose Down
ALTER TABLE leader DROP COLUMN address;
